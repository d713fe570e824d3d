package daemon

import (
	"context"
	"errors"
	"testing"

	"github.com/dlfs/dlfs/catalog"
)

// TestRefreshStatusCounts: stats tell what the last rescan found, and a
// failed one its error and no counts.
func TestRefreshStatusCounts(t *testing.T) {
	fail := false
	r := newRefresher(func(context.Context) (catalog.Diff, error) {
		if fail {
			return catalog.Diff{}, errors.New("SOURCE is gone")
		}
		return catalog.Diff{Added: make([]*catalog.Entry, 2), Removed: make([]*catalog.Entry, 1)}, nil
	})
	defer r.close()
	if err := r.refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := r.status(); st.Running || st.Added != 2 || st.Removed != 1 || st.Changed != 0 || st.Error != "" || st.Ended.IsZero() {
		t.Errorf("after a rescan: %+v", st)
	}
	fail = true
	if err := r.refresh(context.Background()); err == nil {
		t.Fatal("a failed rescan reported no error")
	}
	if st := r.status(); st.Added != 0 || st.Error != "SOURCE is gone" {
		t.Errorf("after a failed rescan: %+v", st)
	}
}

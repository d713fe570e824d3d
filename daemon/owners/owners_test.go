package owners

import (
	"strings"
	"testing"
)

// TestNewRefusesBadConfig: a configuration that cannot work fails New
// with one line that says what is wrong, and starts nothing.
func TestNewRefusesBadConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no node name", Config{Dataset: "d"}, "no node name"},
		{"no dataset", Config{NodeName: "a"}, "no dataset identity"},
		{"negative epochs", Config{NodeName: "a", Dataset: "d", PlacementEpochs: -1}, "negative"},
		{"no dependencies", Config{NodeName: "a", Dataset: "d"}, "dependency is missing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := New(c.cfg, Deps{})
			if err == nil {
				o.Close()
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line naming %q", err, c.want)
			}
		})
	}
	if err := DefaultConfig().Validate(); err == nil || !strings.Contains(err.Error(), "no node name") {
		t.Errorf("the defaults name no node: %v", err)
	}
}

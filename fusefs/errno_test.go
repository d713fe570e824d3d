package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"syscall"
	"testing"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/source"
)

// TestToErrno: each kind of error from the layers below reaches the
// application as its errno, wrapped or not; anything unknown is EIO.
func TestToErrno(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{fmt.Errorf("job: %w", control.ErrSyntax), syscall.EINVAL},
		{fmt.Errorf("open x: %w", fs.ErrNotExist), syscall.ENOENT},
		{fmt.Errorf("open x: %w", syscall.ENOENT), syscall.ENOENT},
		{fmt.Errorf("read: %w", source.ErrChanged), syscall.ESTALE},
		{fmt.Errorf("open: %w", source.ErrPath), syscall.EACCES},
		{fmt.Errorf("read: %w", context.Canceled), syscall.EINTR},
		{fmt.Errorf("read: %w", syscall.EIO), syscall.EIO},
		{fmt.Errorf("read: %w", syscall.ELOOP), syscall.ELOOP},
		{errors.New("something else"), syscall.EIO},
	} {
		if got := toErrno(log, "op", c.err); got != c.want {
			t.Errorf("toErrno(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

package fusefs

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"syscall"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/source"
)

// toErrno turns an error from the layers below into the errno the kernel
// returns to the application. It is the only place that does so. Errors
// that say something about the daemon rather than the caller's request are
// logged.
func toErrno(log *slog.Logger, op string, err error) syscall.Errno {
	var en syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.Is(err, control.ErrSyntax):
		return syscall.EINVAL
	case errors.Is(err, fs.ErrNotExist):
		log.Warn("fusefs: file vanished from SOURCE; write 'refresh' to the control file", "op", op, "err", err)
		return syscall.ENOENT
	case errors.Is(err, source.ErrChanged):
		log.Warn("fusefs: file changed in SOURCE", "op", op, "err", err)
		return syscall.ESTALE
	case errors.Is(err, source.ErrPath):
		return syscall.EACCES
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.As(err, &en):
		log.Warn("fusefs: request failed", "op", op, "err", err)
		return en
	}
	log.Error("fusefs: request failed", "op", op, "err", err)
	return syscall.EIO
}

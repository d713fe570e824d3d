package main

import (
	"fmt"
	"os"
	"sync"
)

// logFile is the daemon's --log-file: appended to, and opened again on
// SIGHUP, so that logrotate can move it away (the next record goes to the
// file at path, made anew). Safe for concurrent use; Write does not block
// beyond the write itself.
type logFile struct {
	path string

	mu sync.Mutex // guards f
	f  *os.File
}

// openLogFile opens path for appending, making it (private: records name
// SOURCE's files) if it is not there.
func openLogFile(path string) (*logFile, error) {
	f, err := openAppend(path)
	if err != nil {
		return nil, err
	}
	return &logFile{path: path, f: f}, nil
}

func openAppend(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--log-file %s: %w; give a file in a directory this user may write", path, unwrapPath(err))
	}
	return f, nil
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

// Reopen opens path again and writes there from now on. On an error the
// old file is kept.
func (l *logFile) Reopen() error {
	f, err := openAppend(l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	return old.Close()
}

// Close closes the file; writes after it fail.
func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

// Package peer moves sample blocks between dlfs nodes: a node asks the
// owner of a sample (package placement) for it instead of reading the PFS.
//
// # Protocol
//
// TCP, length-prefixed frames (4-byte big-endian length), each starting
// with a one-byte type (wire.go). A connection opens with a mutual
// challenge: the client sends a nonce, the server answers with its own
// nonce and HMAC-SHA256(key, "dlfs-server" | client nonce | server nonce),
// the client proves itself with HMAC-SHA256(key, "dlfs-client" | server
// nonce | client nonce). Only then are requests read, so a client without
// the cluster key gets nothing, and learns nothing. Requests carry an id
// and up to MaxItems blocks named by catalog identity (path, size, mtime,
// block number); many may be in flight on one connection, and responses
// are matched by id.
//
// # Confinement
//
// The server resolves a path only through its catalog and reads only
// through its loader (Source): a name outside the dataset, or another
// version of a file, is StatusMissing. No request reaches the filesystem
// by path.
package peer

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"time"
)

const nonceLen = 16

// ErrAuth means the other side does not know the cluster key.
var ErrAuth = errors.New("peer: authentication failed (is the cluster key the same on both nodes?)")

// handshakeTimeout bounds the challenge exchange.
const handshakeTimeout = 5 * time.Second

func mac(key []byte, label string, a, b []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(a)
	m.Write(b)
	return m.Sum(nil)
}

func nonce() ([]byte, error) {
	n := make([]byte, nonceLen)
	_, err := rand.Read(n)
	return n, err
}

// clientHandshake proves the client and checks the server.
func clientHandshake(rw io.ReadWriter, key []byte) error {
	nc, err := nonce()
	if err != nil {
		return err
	}
	if err := writeFrame(rw, append([]byte{msgHello}, nc...)); err != nil {
		return err
	}
	ch, err := readFrame(rw)
	if err != nil {
		return fmt.Errorf("peer: handshake: %w", err)
	}
	if len(ch) != 1+nonceLen+sha256.Size || ch[0] != msgChallenge {
		return fmt.Errorf("%w: bad challenge", ErrWire)
	}
	ns := ch[1 : 1+nonceLen]
	if !hmac.Equal(ch[1+nonceLen:], mac(key, "dlfs-server", nc, ns)) {
		return ErrAuth
	}
	return writeFrame(rw, append([]byte{msgProof}, mac(key, "dlfs-client", ns, nc)...))
}

// serverHandshake checks the client and proves the server.
func serverHandshake(rw io.ReadWriter, key []byte) error {
	hello, err := readFrame(rw)
	if err != nil {
		return err
	}
	if len(hello) != 1+nonceLen || hello[0] != msgHello {
		return fmt.Errorf("%w: bad hello", ErrWire)
	}
	nc := hello[1:]
	ns, err := nonce()
	if err != nil {
		return err
	}
	ch := append(append([]byte{msgChallenge}, ns...), mac(key, "dlfs-server", nc, ns)...)
	if err := writeFrame(rw, ch); err != nil {
		return err
	}
	proof, err := readFrame(rw)
	if err != nil {
		return err
	}
	if len(proof) != 1+sha256.Size || proof[0] != msgProof || !hmac.Equal(proof[1:], mac(key, "dlfs-client", ns, nc)) {
		return ErrAuth
	}
	return nil
}

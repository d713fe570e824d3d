// Package peer moves sample blocks between dlfs nodes: a node asks the
// owner of a sample (package placement) for it instead of reading the PFS.
//
// # Sealing
//
// Every connection is TLS 1.3 (crypto/tls), with mutual authentication by
// the cluster key: both ends derive one Ed25519 key pair from it (HKDF-
// SHA256), present a certificate for it, and accept only a peer that
// presents the same public key. Every frame after the handshake is
// encrypted and authenticated by TLS's record layer, so a relay can
// neither read nor change a block, and a node without the key gets
// nothing and learns nothing. A server runs at most MaxHandshakes
// handshakes at once, each for at most handshakeTimeout (and helloTimeout
// for its first byte), and lets at most MaxQueued more connections wait
// for one; one source address holds at most MaxPerAddress of these, so a
// keyless client cannot lock real peers out (package netlimit). TLS
// bounds what a handshake may make it read. Refusals are logged at a
// bounded rate.
//
// # Protocol
//
// Inside TLS, length-prefixed frames (4-byte big-endian length), each
// starting with a one-byte type (wire.go). Requests carry an id and up to
// MaxItems blocks, each named by path, block number and the asker's
// integrity tag for it (package integrity: dataset, key and file version);
// many may be in flight on one connection, and responses are matched by
// id. A response carries each block's bytes with their integrity sum, which
// the asker checks under its own tag: a peer of another dataset, or with
// another version of the file, answers StatusMissing, and a block that
// fails its sum is never used. A server answers at most MaxResponseBytes
// of blocks per request, StatusError for the rest.
//
// # Confinement
//
// The server resolves a path only through its catalog and reads only
// through its loader (Source): a name outside the dataset, or another
// version of a file, is StatusMissing. No request reaches the filesystem
// by path. A panic while serving one request fails that request only.
package peer

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// ErrAuth means the other side does not know the cluster key.
var ErrAuth = errors.New("peer: authentication failed (is the cluster key the same on both nodes?)")

// handshakeTimeout bounds the TLS handshake.
const handshakeTimeout = 5 * time.Second

// A server runs at most MaxHandshakes handshakes at once. Connections past
// them wait for a slot, reading nothing, for at most handshakeTimeout, and
// at most MaxQueued wait; more are closed at once. One source address
// holds at most MaxPerAddress connections waiting or in a handshake. A
// connection with a slot that sends nothing for helloTimeout is closed.
// Refusals are logged at most once per logEvery for each reason.
const (
	MaxHandshakes = 32
	MaxQueued     = 1024
	MaxPerAddress = 8
	helloTimeout  = time.Second
	logEvery      = 10 * time.Second
)

// tlsConfig returns the TLS 1.3 configuration of both ends for the
// cluster key: a certificate for the key pair derived from it, and a check
// that the other end presents the same public key. An empty key (the
// operator's --insecure) derives a pair anyone can: sealed, not
// authenticated.
func tlsConfig(key []byte) (*tls.Config, error) {
	seed, err := hkdf.Key(sha256.New, key, []byte("dlfs peer"), "dlfs peer tls v1 ed25519", ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("peer: derive the key pair: %w", err)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial, NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<36, 0),
		DNSNames: []string{"dlfs"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return nil, fmt.Errorf("peer: make the certificate: %w", err)
	}
	verify := func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) != 1 {
			return ErrAuth
		}
		c, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return ErrAuth
		}
		if k, ok := c.PublicKey.(ed25519.PublicKey); !ok || !k.Equal(pub) {
			return ErrAuth
		}
		return nil
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}},
		ClientAuth:   tls.RequireAnyClientCert,
		ServerName:   "dlfs",
		// The chain is not a PKI's: VerifyPeerCertificate checks the key.
		InsecureSkipVerify:    true,
		VerifyPeerCertificate: verify,
	}, nil
}

package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Meta is what a node tells the others about itself in its gossip
// metadata.
type Meta struct {
	DataAddr string `json:"data"`    // HOST:PORT of the peer data transport
	Dataset  string `json:"dataset"` // identity of the dataset it mounts
	RAM      int64  `json:"ram"`     // RAM tier capacity in bytes
	SSD      int64  `json:"ssd"`     // SSD tier capacity in bytes
	// Placement is the version of the placement hash the node uses
	// (placement.HashVersion): nodes of different versions would disagree
	// on every owner, so they share no dataset.
	Placement int `json:"placement,omitempty"`
	// Jobs are the jobs this node runs ranks of, as job lines (package
	// control) whose epoch is the first one announced: placement reads
	// them to put samples where they are read most. The reader parses
	// and checks them.
	Jobs []string `json:"jobs,omitempty"`
}

// metaV1 is the first byte of encoded metadata: every gossip payload
// starts with a one-byte type.
const metaV1 = 1

// MaxMeta is memberlist's limit on node metadata.
const MaxMeta = 512

// ErrMeta wraps every metadata decoding error.
var ErrMeta = errors.New("cluster: bad node metadata")

// Encode returns m as node metadata.
func (m Meta) Encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	b = append([]byte{metaV1}, b...)
	if len(b) > MaxMeta {
		return nil, fmt.Errorf("%w: %d bytes is over the %d-byte limit; shorten the dataset identity or run fewer jobs", ErrMeta, len(b), MaxMeta)
	}
	return b, nil
}

// DecodeMeta parses node metadata from a peer. It never panics.
func DecodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) == 0 {
		return m, fmt.Errorf("%w: empty", ErrMeta)
	}
	if b[0] != metaV1 {
		return m, fmt.Errorf("%w: unknown version %d", ErrMeta, b[0])
	}
	if len(b) > MaxMeta {
		return m, fmt.Errorf("%w: %d bytes", ErrMeta, len(b))
	}
	if err := json.Unmarshal(b[1:], &m); err != nil {
		return m, fmt.Errorf("%w: %v", ErrMeta, err)
	}
	if m.RAM < 0 || m.SSD < 0 {
		return m, fmt.Errorf("%w: negative capacity", ErrMeta)
	}
	return m, nil
}

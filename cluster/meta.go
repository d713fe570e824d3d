package cluster

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dlfs/dlfs/control"
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
	// them to put samples where they are read most. DecodeMeta parses
	// and checks them into Specs.
	Jobs []string `json:"jobs,omitempty"`
	// Specs are Jobs as DecodeMeta parsed them, once, on arrival: each
	// merged over control.DefaultJob and checked, in order. A line that
	// does not parse or check is left out (a peer whose view differs;
	// hashing still places its samples). Not gossiped: Jobs are.
	Specs []control.Job `json:"-"`
	// jobErrs say why the lines left out of Specs were.
	jobErrs []error
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
	for _, line := range m.Jobs {
		spec, err := control.ParseLine(line)
		if err != nil {
			m.jobErrs = append(m.jobErrs, fmt.Errorf("job line %q: %w", line, err))
			continue
		}
		m.Specs = append(m.Specs, spec)
	}
	return m, nil
}

package packed

import "github.com/dlfs/dlfs/loader"

// The datasets read neighbouring samples together: the loader finds that
// by a type assertion, so a signature that drifted would only turn
// coalescing off. The test alone imports loader (packed itself does not:
// Span is package runs's).
var (
	_ loader.Coalescer = (*recDataset)(nil)
	_ loader.Coalescer = (*seqDataset)(nil)
)

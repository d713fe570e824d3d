package integrity

import "testing"

// TestSegmentsOfOneSegment: data of at most one segment has no segment
// sums (its Sum covers it), and data of one byte more has two, the
// second over that byte alone.
func TestSegmentsOfOneSegment(t *testing.T) {
	for _, n := range []int{0, 1, SegmentBytes} {
		if s := Segments(3, make([]byte, n)); s != nil {
			t.Errorf("Segments of %d bytes = %d sums; want none", n, len(s))
		}
	}
	data := make([]byte, SegmentBytes+1)
	data[SegmentBytes] = 7
	s := Segments(3, data)
	if len(s) != 2 || s[1] != Sum(segmentTag(3, 1), data[SegmentBytes:]) || s[0] != Sum(segmentTag(3, 0), data[:SegmentBytes]) {
		t.Errorf("Segments of one segment and a byte = %v", s)
	}
}

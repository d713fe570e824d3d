// Package placement decides which cluster member owns each sample.
//
// # Rule
//
// Ownership is weighted rendezvous hashing (highest random weight): every
// member scores every key by w / -ln(u), where u is a uniform hash of the
// member's name and the key in (0, 1) and w is the member's capacity; the
// highest score owns the key. It is a pure function of the members and the
// key, so every node computes the same table without talking to the others,
// and:
//
//   - every key has exactly one owner (partitions are disjoint);
//   - a member owns a share of the keys proportional to its capacity;
//   - when a member leaves, only the keys it owned move, spread over the
//     others in proportion to their capacities; when one joins, it takes
//     keys only, in proportion to its capacity. Nothing else moves.
//
// Ties (equal scores) go to the member whose name sorts first.
//
// # Buckets
//
// Rendezvous costs a score per member per key: 14.2 M samples over 64
// members of unequal capacity took 13 s. So keys are hashed into a fixed
// 2^18 buckets, and rendezvous places each bucket the first time a key
// of it is asked about, once per table (a table is made on every change of
// the view, so New stays cheap): a key's owner is its bucket's, a hash and
// an index. The properties above hold
// for buckets, so for keys: a member that leaves gives up its buckets
// only, one that joins takes buckets only, and shares follow capacities
// within the granularity of 2^18 buckets (256 a member at 1,024 members).
//
// # Demand
//
// When the cluster knows its jobs' plans, Assign moves samples to the
// members that will read them most (see Assign). Keys outside the plans
// keep their hashed owners, so the properties above hold for them; the
// planned samples follow the plans, within each member's quota.
//
// A table change is on the path of a member leaving: every member makes
// the new table before it stops asking the one that left. At a million
// samples Assign reads each sample once in its own order, hashes each
// key once, puts them in key order by a scatter on the hash's top byte
// and sorts in cache, and allocates nothing per sample (about 0.7 CPU-s);
// the table keeps its assignments sorted by key hash, with an
// open-addressing index by the same hash for Owner, so two tables are
// compared, and the samples that moved between them listed
// (AssignedDiff), in one merge with no lookup.
//
// A Table is immutable and safe for concurrent use.
package placement

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync/atomic"
)

// HashVersion names the placement hash: nodes that hash differently must
// not share a dataset (they gossip it). Version 2 hashes a key once and
// mixes it with each member's seed (version 1 hashed the pair); version 3
// places buckets of keys.
const HashVersion = 3

// Member is one node as placement sees it.
type Member struct {
	Name     string
	Capacity int64 // bytes it can cache (RAM + SSD); must be positive
}

// Table assigns keys to members.
type Table struct {
	members []Member // sorted by name
	weights []float64
	demand  demandIndex     // owners set by demand (Assign) where they differ from the hash
	planned [2]int64        // Planned
	print   uint64          // Fingerprint
	seeds   []uint64        // a hash of each member's name
	uniform bool            // every weight equal: the highest hash wins, no logarithm needed
	buckets []atomic.Uint32 // the owner of each bucket of keys, plus 1; 0: not placed yet
}

// bucketBits sets how many buckets keys are hashed into.
const bucketBits = 18

// ErrMembers means the member list cannot make a table.
var ErrMembers = errors.New("placement: bad member list")

// New returns the table of members.
func New(members []Member) (*Table, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("%w: no members", ErrMembers)
	}
	if len(members) > math.MaxUint16 {
		return nil, fmt.Errorf("%w: %d members, more than %d", ErrMembers, len(members), math.MaxUint16)
	}
	ms := append([]Member(nil), members...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
	t := &Table{members: ms, weights: make([]float64, len(ms)), seeds: make([]uint64, len(ms)), uniform: true}
	for i, m := range ms {
		if m.Capacity <= 0 {
			return nil, fmt.Errorf("%w: member %q has capacity %d", ErrMembers, m.Name, m.Capacity)
		}
		if i > 0 && ms[i-1].Name == m.Name {
			return nil, fmt.Errorf("%w: member %q listed twice", ErrMembers, m.Name)
		}
		t.weights[i] = float64(m.Capacity)
		t.seeds[i] = fnv64a(m.Name, "")
		t.uniform = t.uniform && m.Capacity == ms[0].Capacity
		t.print = mix(t.print ^ fnv64a(m.Name, fmt.Sprint(m.Capacity)))
	}
	t.buckets = make([]atomic.Uint32, 1<<bucketBits)
	return t, nil
}

// Fingerprint identifies what t says: two tables with the same members,
// capacities and demand assignments have the same fingerprint on every
// node, and two that differ almost surely do not.
func (t *Table) Fingerprint() uint64 { return t.print }

// mix is the splitmix64 finaliser.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Equal reports whether t and o give every key the same owner: the same
// members with the same capacities, and the same demand assignments.
func (t *Table) Equal(o *Table) bool {
	if t == nil || o == nil {
		return t == o
	}
	if t.print != o.print || len(t.members) != len(o.members) || len(t.demand.keys) != len(o.demand.keys) {
		return false // the fingerprints of equal tables are equal: a cheap test first
	}
	for i := range t.members {
		if t.members[i] != o.members[i] {
			return false
		}
	}
	for i, a := range t.demand.keys { // both sorted by hash and key
		if b := o.demand.keys[i]; a.key != b.key || a.owner != b.owner {
			return false
		}
	}
	return true
}

// Members returns the members sorted by name. The slice must not be
// modified.
func (t *Table) Members() []Member { return t.members }

// Owner returns the index (into Members) of the member that owns key.
func (t *Table) Owner(key string) int {
	kh := fnv64a("", key)
	if a := t.demand.find(key, kh); a != nil {
		return int(a.owner)
	}
	return t.BucketOwner(bucketOf(kh))
}

// Buckets is how many buckets keys are hashed into, the same for every
// table.
const Buckets = 1 << bucketBits

// Bucket returns the bucket of key.
func Bucket(key string) int { return bucketOf(fnv64a("", key)) }

// bucketOf is the bucket of a key whose hash (fnv64a("", key)) is kh.
func bucketOf(kh uint64) int { return int(kh >> (64 - bucketBits)) }

// BucketOwner returns the owner of bucket b's keys, except those Assigned
// elsewhere.
func (t *Table) BucketOwner(b int) int {
	if o := t.buckets[b].Load(); o != 0 {
		return int(o - 1)
	}
	// Racing callers compute the same owner.
	o := t.rendezvous(mix(uint64(b) + 0x9e3779b97f4a7c15))
	t.buckets[b].Store(uint32(o) + 1)
	return o
}

// Assignment is where demand placed a key away from its bucket's owner.
type Assignment struct {
	Owner  int   // the index (into Members) of the member demand chose
	Bucket int   // the key's bucket (Bucket(key)), which BucketOwner places
	Size   int64 // the sample's size, as Assign was given it
}

// Assigned calls fn for each key that demand placed away from its
// bucket's owner, with where it placed it: a pass over them that hashes
// no key and asks no catalog.
func (t *Table) Assigned(fn func(key string, a Assignment)) {
	for i := range t.demand.keys {
		a := &t.demand.keys[i]
		fn(a.key, Assignment{Owner: int(a.owner), Bucket: bucketOf(a.hash), Size: a.size})
	}
}

// AssignedOwner returns the owner demand placed key on, if it placed it
// away from its bucket's owner.
func (t *Table) AssignedOwner(key string) (int, bool) {
	if a := t.demand.find(key, fnv64a("", key)); a != nil {
		return int(a.owner), true
	}
	return 0, false
}

// NumAssigned is how many keys demand placed away from their buckets'
// owners.
func (t *Table) NumAssigned() int { return len(t.demand.keys) }

// hashOwner is the owner of key's bucket.
func (t *Table) hashOwner(key string) int { return t.BucketOwner(Bucket(key)) }

// rendezvous is the owner of a bucket whose hash is kh: the member with
// the highest score weight / −ln(u), u a hash of (member, bucket) in
// (0, 1), mixed from kh and the member's seed; with equal weights the
// highest u wins, which is the same member without the logarithm.
func (t *Table) rendezvous(kh uint64) int {
	best := 0
	if t.uniform {
		var bestH uint64
		for i, seed := range t.seeds {
			if h := mix(seed^kh) >> 11; h > bestH || i == 0 {
				best, bestH = i, h
			}
		}
		return best
	}
	bestScore := math.Inf(-1)
	for i := range t.members {
		if score := t.scoreHash(i, kh); score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// score is member i's rendezvous score for key.
func (t *Table) score(i int, key string) float64 { return t.scoreHash(i, fnv64a("", key)) }

func (t *Table) scoreHash(i int, kh uint64) float64 {
	u := (float64(mix(t.seeds[i]^kh)>>11) + 0.5) / (1 << 53) // in (0, 1)
	return t.weights[i] / -math.Log(u)
}

// fnv64a is FNV-1a over member, a zero byte and key, finished with a
// 64-bit mixer: stable across processes and architectures.
func fnv64a(member, key string) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := 0; i < len(member); i++ {
		h ^= uint64(member[i])
		h *= prime
	}
	h *= prime // the zero separator byte
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	return mix(h) // FNV's low bits are weak
}

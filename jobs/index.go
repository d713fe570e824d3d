package jobs

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
)

// Dataset indexes: an ImageFolder walk of the catalog or a list file,
// cut to what the job's owner may read, and shared between the jobs of
// one dataset and user.

// Index builds the dataset index of spec from the current snapshot, as a
// job line with spec would, without registering a job.
func (r *Registry) Index(spec control.Job) ([]folder.Sample, error) {
	return r.IndexAs(access.Root, spec)
}

// IndexAs is Index as user cred sees the dataset: only the samples it may
// read by their paths (see Job.Owner).
func (r *Registry) IndexAs(cred access.Cred, spec control.Job) ([]folder.Sample, error) {
	x, err := r.index(spec, Owner{Cred: cred})
	return x.samples, err
}

// indexed is a dataset index as one user sees it.
type indexed struct {
	samples []folder.Sample
	classes int
	snap    *catalog.Snapshot
	public  bool // every user may read every sample
}

// index builds the dataset index of spec from the current snapshot, as
// owner may read it, or shares the index of a registered job over the
// same dataset and snapshot seen by the same user: the jobs of a sweep,
// and the inferred jobs of several reading processes, read one dataset,
// whose index is 24 bytes a sample.
func (r *Registry) index(spec control.Job, owner Owner) (indexed, error) {
	snap := r.cfg.Snapshot()
	r.mu.Lock()
	for _, j := range r.jobs {
		if j.snap == snap && j.Spec.SameDataset(spec) && j.Owner.view() == owner.view() {
			r.mu.Unlock()
			return indexed{j.Samples, j.Classes, snap, j.Public}, nil
		}
	}
	r.mu.Unlock()
	var (
		samples []folder.Sample
		classes int
		err     error
	)
	walked := spec.Dataset != "list"
	if walked {
		samples, classes, err = r.folder(snap, spec)
	} else {
		samples, classes, err = r.list(snap, spec, owner.Cred)
	}
	if err != nil {
		return indexed{}, err
	}
	all := len(samples)
	samples = visible(snap, spec.Root, samples, owner.Cred, walked)
	if len(samples) == 0 {
		return indexed{}, fmt.Errorf("%w: root=%s holds no samples with extensions %v that uid %d may read (of %d)", ErrJob, spec.Root, exts(spec), owner.Uid, all)
	}
	return indexed{samples, classes, snap, public(snap, spec.Root, samples, walked)}, nil
}

// folder builds the ImageFolder index of spec, as root sees it.
func (r *Registry) folder(snap *catalog.Snapshot, spec control.Job) ([]folder.Sample, int, error) {
	idx, err := folder.Build(snap, spec.Root, spec.Extensions)
	if errors.Is(err, folder.ErrTooLarge) {
		return nil, 0, fmt.Errorf("%w: root=%s: %v", ErrJob, spec.Root, err)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: root=%s: not a directory of the mount", ErrJob, spec.Root)
	}
	if len(idx.Samples) == 0 {
		return nil, 0, fmt.Errorf("%w: root=%s holds no samples with extensions %v", ErrJob, spec.Root, exts(spec))
	}
	return idx.Samples, len(idx.Classes), nil
}

func exts(spec control.Job) []string {
	if spec.Extensions == nil {
		return folder.IMGExtensions
	}
	return spec.Extensions
}

// list reads dataset=list:PATH: one sample path per line, relative to
// root; blank lines are skipped. The list must be a file cred may read:
// its lines are quoted in errors.
func (r *Registry) list(snap *catalog.Snapshot, spec control.Job, cred access.Cred) ([]folder.Sample, int, error) {
	e, err := folder.Resolve(snap, spec.ListPath)
	if err != nil || !e.IsRegular() || !cred.CanRead(e) {
		return nil, 0, fmt.Errorf("%w: dataset=list:%s: no such file in the mount that uid %d may read", ErrJob, spec.ListPath, cred.Uid)
	}
	if e.Size > r.cfg.MaxListBytes {
		return nil, 0, fmt.Errorf("%w: dataset=list:%s: %d bytes is more than %d", ErrJob, spec.ListPath, e.Size, r.cfg.MaxListBytes)
	}
	data, err := r.cfg.ReadFile(e)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: dataset=list:%s: %v", ErrJob, spec.ListPath, err)
	}
	root := strings.Trim(path.Clean("/"+spec.Root), "/")
	var out []folder.Sample
	for i, line := range bytes.Split(data, []byte("\n")) {
		p := strings.TrimSpace(string(line))
		if p == "" {
			continue
		}
		full := strings.Trim(path.Clean("/"+root+"/"+p), "/")
		f, err := folder.Resolve(snap, full)
		if err != nil || !f.IsRegular() {
			return nil, 0, fmt.Errorf("%w: dataset=list:%s line %d: %q is not a file of the mount", ErrJob, spec.ListPath, i+1, p)
		}
		out = append(out, folder.NewSample(full, f, 0))
	}
	if len(out) == 0 {
		return nil, 0, fmt.Errorf("%w: dataset=list:%s lists no samples", ErrJob, spec.ListPath)
	}
	return out, 0, nil
}

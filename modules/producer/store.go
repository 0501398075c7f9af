package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// State is what a producer must not forget across a crash.
type State struct {
	// Last is the highest sequence ever assigned.
	Last int64
	// Free holds sequences at or below Last that the service refused
	// without retaining anything; they are handed out again, lowest first,
	// so the stream stays contiguous.
	Free []int64
	// Pending holds signed envelopes that were written before their send
	// and have no answer yet, in sequence order.
	Pending []Pending
}

// Pending is one signed envelope awaiting its answer: Envelope is its
// canonical form, re-sent byte for byte.
type Pending struct {
	Sequence int64
	EventID  string
	Envelope []byte
}

// A SequenceStore keeps one stream's State. Save must be durable when it
// returns: the producer saves before every send, so an envelope the service
// may have accepted is never forgotten.
type SequenceStore interface {
	Load(ctx context.Context) (State, error)
	Save(ctx context.Context, s State) error
}

// MemoryStore is a SequenceStore that forgets everything when the process
// ends; for tests and for producers that never restart.
type MemoryStore struct {
	mu sync.Mutex
	s  State
}

// Load returns a copy of the saved state.
func (m *MemoryStore) Load(context.Context) (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return cloneState(m.s), nil
}

// Save keeps a copy of s.
func (m *MemoryStore) Save(_ context.Context, s State) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.s = cloneState(s)
	return nil
}

func cloneState(s State) State {
	c := State{Last: s.Last, Free: slices.Clone(s.Free)}
	for _, p := range s.Pending {
		c.Pending = append(c.Pending, Pending{Sequence: p.Sequence, EventID: p.EventID, Envelope: slices.Clone(p.Envelope)})
	}
	return c
}

// FileStore is the default SequenceStore: one JSON file, replaced
// atomically on every Save (write a temporary file, fsync it, rename it over
// the old one, fsync the directory), so after a crash the file holds either
// the previous state or the new one, never a torn mix. One process at a time
// may use a file.
type FileStore struct {
	path string
}

// NewFileStore keeps the state in path; its directory must exist. A missing
// file is an empty state (a new stream).
func NewFileStore(path string) *FileStore { return &FileStore{path: path} }

// fileState is the file's format. Envelopes are base64 ([]byte) rather than
// embedded JSON: an encoder may re-escape embedded JSON, and a re-sent
// envelope must be the same bytes that were signed and maybe accepted.
type fileState struct {
	Version int           `json:"version"`
	Last    int64         `json:"last"`
	Free    []int64       `json:"free"`
	Pending []filePending `json:"pending"`
}

type filePending struct {
	Sequence int64  `json:"sequence"`
	EventID  string `json:"event_id"`
	Envelope []byte `json:"envelope"`
}

const fileStateVersion = 1

// Load reads the file.
func (f *FileStore) Load(context.Context) (State, error) {
	b, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("producer: read sequence file: %w", err)
	}
	var fs fileState
	if err := json.Unmarshal(b, &fs); err != nil {
		return State{}, fmt.Errorf("producer: sequence file %s is not a producer state: %w", f.path, err)
	}
	if fs.Version != fileStateVersion {
		return State{}, fmt.Errorf("producer: sequence file %s has version %d, want %d", f.path, fs.Version, fileStateVersion)
	}
	s := State{Last: fs.Last, Free: fs.Free}
	for _, p := range fs.Pending {
		s.Pending = append(s.Pending, Pending(p))
	}
	return s, nil
}

// Save replaces the file with s and returns once it is on disk.
func (f *FileStore) Save(_ context.Context, s State) error {
	fs := fileState{Version: fileStateVersion, Last: s.Last, Free: s.Free, Pending: make([]filePending, 0, len(s.Pending))}
	for _, p := range s.Pending {
		fs.Pending = append(fs.Pending, filePending(p))
	}
	b, err := json.Marshal(fs)
	if err != nil {
		return fmt.Errorf("producer: encode state: %w", err)
	}
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.path)+".*")
	if err != nil {
		return fmt.Errorf("producer: save state: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("producer: save state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("producer: save state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("producer: save state: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("producer: save state: %w", err)
	}
	// The rename is durable only once the directory entry is.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("producer: save state: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("producer: save state: %w", err)
	}
	return nil
}

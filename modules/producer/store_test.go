package producer

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestStoresRoundTripState(t *testing.T) {
	ctx := context.Background()
	st := State{Last: 9, Free: []int64{4}, Pending: []Pending{
		{Sequence: 8, EventID: "e-8", Envelope: []byte(`{"a":"<&>\u2028"}`)},
		{Sequence: 9, Envelope: []byte(`{"b":1}`)},
	}}
	for name, s := range map[string]SequenceStore{
		"memory": &MemoryStore{},
		"file":   NewFileStore(filepath.Join(t.TempDir(), "s.json")),
	} {
		empty, err := s.Load(ctx)
		if err != nil || empty.Last != 0 || len(empty.Pending) != 0 {
			t.Fatalf("%s: fresh store %+v %v", name, empty, err)
		}
		if err := s.Save(ctx, st); err != nil {
			t.Fatal(err)
		}
		st.Pending[0].Envelope[0] = 'X' // the store must hold its own copy
		got, err := s.Load(ctx)
		st.Pending[0].Envelope[0] = '{'
		if err != nil || !reflect.DeepEqual(got, st) {
			t.Fatalf("%s: loaded %+v %v, want %+v", name, got, err, st)
		}
	}
}

func TestFileStoreReplacesAtomicallyAndRefusesForeignFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "s.json")
	fs := NewFileStore(path)
	for i := int64(1); i <= 3; i++ {
		if err := fs.Save(ctx, State{Last: i}); err != nil {
			t.Fatal(err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("%d files left in the directory, want only the state", len(entries))
	}
	if st, _ := fs.Load(ctx); st.Last != 3 {
		t.Fatalf("last %d", st.Last)
	}
	for name, content := range map[string]string{"not json": "garbage", "other version": `{"version":2,"last":1}`} {
		os.WriteFile(path, []byte(content), 0o600)
		if _, err := fs.Load(ctx); err == nil {
			t.Errorf("%s: loaded", name)
		} else if bytes.Contains([]byte(err.Error()), []byte("garbage")) {
			t.Errorf("%s: error echoes the file", name)
		}
	}
	if err := NewFileStore(filepath.Join(dir, "missing", "s.json")).Save(ctx, State{}); err == nil {
		t.Error("saved into a directory that does not exist")
	}
}

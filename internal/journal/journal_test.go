package journal

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var errNotFound = errors.New("not found")

type note struct {
	Text string `json:"text"`
}

// TestSpare: a record created into a spare reads back as written,
// takes the spare's place, and is refused where the record exists; a
// record without a spare, or longer than one, is created all the same;
// recovery drops the spares of records that are gone.
func TestSpare(t *testing.T) {
	recs := Journal[note]{Dir: t.TempDir(), What: "deployment", NotFound: errNotFound}
	spares := Journal[note]{Dir: t.TempDir(), What: "slot", NotFound: errNotFound}
	if err := spares.Reserve("s1"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(spares.SparePath("s1")); err != nil || st.Size() != spareSize {
		t.Fatalf("spare after reserve: %v, %v; want a file of %d bytes", st, err, spareSize)
	}
	if l, err := spares.List(); err != nil || len(l) != 0 {
		t.Fatalf("list with only a spare = %v, %v; want no record", l, err)
	}

	if err := recs.CreateFrom(spares.SparePath("s1"), "d1", &note{"first"}); err != nil {
		t.Fatal(err)
	}
	if got, err := recs.Load("d1"); err != nil || got.Text != "first" {
		t.Fatalf("load = %+v, %v; want the record written", got, err)
	}
	if _, err := os.Stat(spares.SparePath("s1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the spare is still there after the record took it: %v", err)
	}

	// The ID is taken: refused, the record as it was, the spare kept.
	if err := spares.Reserve("s2"); err != nil {
		t.Fatal(err)
	}
	if err := recs.CreateFrom(spares.SparePath("s2"), "d1", &note{"second"}); !errors.Is(err, ErrExists) {
		t.Fatalf("createFrom over an existing record = %v, want ErrExists", err)
	}
	if got, _ := recs.Load("d1"); got.Text != "first" {
		t.Fatalf("the existing record became %+v", got)
	}
	// Written over once, the spare still makes a whole record.
	if err := recs.CreateFrom(spares.SparePath("s2"), "d2", &note{"x"}); err != nil {
		t.Fatal(err)
	}
	if got, err := recs.Load("d2"); err != nil || got.Text != "x" {
		t.Fatalf("load after a refused attempt = %+v, %v; want the record written", got, err)
	}

	// No spare; a record longer than a spare.
	if err := recs.CreateFrom(spares.SparePath("none"), "d3", &note{"no spare"}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("y", 2*spareSize)
	if err := spares.Reserve("s3"); err != nil {
		t.Fatal(err)
	}
	if err := recs.CreateFrom(spares.SparePath("s3"), "d4", &note{long}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"d3": "no spare", "d4": long} {
		if got, err := recs.Load(id); err != nil || got.Text != want {
			t.Fatalf("load %s = %.40q, %v", id, got.Text, err)
		}
	}
	if l, err := recs.List(); err != nil || len(l) != 4 {
		t.Fatalf("list = %d records, %v; want 4", len(l), err)
	}

	// Recovery: the spare of a slot whose record is gone goes; one whose
	// record is there stays.
	if err := spares.Save("kept", &note{"slot"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"kept", "orphan"} {
		if err := spares.Reserve(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := spares.DropSpares(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spares.SparePath("kept")); err != nil {
		t.Fatalf("dropSpares removed the spare of a record that exists: %v", err)
	}
	if _, err := os.Stat(spares.SparePath("orphan")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dropSpares kept the spare of a record that is gone: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(recs.Dir, "*.spare")); len(left) != 0 {
		t.Fatalf("spares in the records' directory: %v", left)
	}
}

// TestRecords: a record reads back as written and saved; a taken ID and a
// missing record wrap the journal's sentinels; IDs lists records only
// (not spares, not a killed writer's temporary files); Remove of a missing
// record is no error.
func TestRecords(t *testing.T) {
	errTaken := errors.New("taken")
	j := Journal[note]{Dir: t.TempDir(), What: "mapping", NotFound: errNotFound, Exists: errTaken, SyncDir: true}
	for _, durable := range []bool{false, true} {
		id := map[bool]string{false: "a", true: "b"}[durable]
		if err := j.Create(id, &note{"v1"}, durable); err != nil {
			t.Fatal(err)
		}
		if err := j.Create(id, &note{"v2"}, durable); !errors.Is(err, errTaken) || !strings.Contains(err.Error(), "mapping "+id) {
			t.Fatalf("Create over %s = %v; want the journal's Exists, naming the record", id, err)
		}
	}
	if err := j.Save("a", &note{"saved"}); err != nil {
		t.Fatal(err)
	}
	if got, err := j.Load("a"); err != nil || got.Text != "saved" {
		t.Fatalf("Load(a) = %+v, %v", got, err)
	}
	if got, err := j.Load("b"); err != nil || got.Text != "v1" {
		t.Fatalf("Load(b) = %+v, %v; want the first write kept", got, err)
	}
	if _, err := j.Load("c"); !errors.Is(err, errNotFound) {
		t.Fatalf("Load(c) = %v; want NotFound", err)
	}
	if err := os.WriteFile(filepath.Join(j.Dir, ".c.123.tmp"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := j.Reserve("d"); err != nil {
		t.Fatal(err)
	}
	if ids, err := j.IDs(); err != nil || strings.Join(ids, ",") != "a,b" {
		t.Fatalf("IDs = %v, %v; want a,b", ids, err)
	}
	if err := j.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if err := j.Remove("a"); err != nil {
		t.Fatalf("Remove of a missing record = %v", err)
	}
	if l, err := j.List(); err != nil || len(l) != 1 || l[0].Text != "v1" {
		t.Fatalf("List = %+v, %v; want b", l, err)
	}
	ents, _ := os.ReadDir(j.Dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") && e.Name() != ".c.123.tmp" {
			t.Errorf("Create left %s", e.Name())
		}
	}
}

// TestListSetsCorruptAside: a record that is not one (a write the machine
// lost) is not dropped without a word: List sets it aside under its
// corrupt name, with its content, logs it, lists the others, and lists it
// no more.
func TestListSetsCorruptAside(t *testing.T) {
	var logged strings.Builder
	j := Journal[note]{Dir: t.TempDir(), What: "slot", NotFound: errNotFound, Log: slog.New(slog.NewTextHandler(&logged, nil))}
	if err := j.Create("good", &note{"kept"}, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(j.Path("lost"), []byte("   \x00\x00{\"te"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := j.List()
	if err != nil || len(got) != 1 || got[0].Text != "kept" {
		t.Fatalf("List = %+v, %v; want the good record only", got, err)
	}
	if b, err := os.ReadFile(j.Path("lost") + CorruptSuffix); err != nil || !strings.Contains(string(b), "{\"te") {
		t.Errorf("the corrupt record set aside: %q, %v; want its content kept", b, err)
	}
	if !strings.Contains(logged.String(), "set aside") || !strings.Contains(logged.String(), "id=lost") {
		t.Errorf("log = %q; want the record named", logged.String())
	}
	if ids, err := j.IDs(); err != nil || !slices.Equal(ids, []string{"good"}) {
		t.Errorf("IDs after List = %v, %v; want good only", ids, err)
	}
}

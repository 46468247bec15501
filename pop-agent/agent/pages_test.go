package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// psi is one message of CRIU's page-server protocol (struct
// page_server_iov: u32 cmd, u64 nr_pages, vaddr, dst_id).
func psi(cmd uint32, nr, vaddr, pid uint64) []byte {
	b := make([]byte, 32)
	binary.LittleEndian.PutUint32(b, cmd)
	binary.LittleEndian.PutUint64(b[8:], nr)
	binary.LittleEndian.PutUint64(b[16:], vaddr)
	binary.LittleEndian.PutUint64(b[24:], pid)
	return b
}

// TestRelayPages: the target's relay between a lazy restore and its page
// session with the source (a fake source here, answering one page). A
// session the restore closes after its pages leaves the deployment
// Running; one the source cuts first leaves it Failed, lost during its
// migration, with the source named; a source that refuses is the same.
// The source is asked with the hand-over's secret, as the target node.
func TestRelayPages(t *testing.T) {
	for _, c := range []struct {
		name   string
		source func(t *testing.T, rw io.ReadWriter)
		lost   bool
	}{
		{"closed", func(t *testing.T, rw io.ReadWriter) {
			req := make([]byte, 32)
			io.ReadFull(rw, req)
			rw.Write(append(psi(4<<16|6, 1, 0x1000, 7), make([]byte, 4096)...))
			io.ReadFull(rw, req)
			if binary.LittleEndian.Uint32(req) != 0x1024 {
				t.Errorf("the restore's last request: %#x; want its close", binary.LittleEndian.Uint32(req))
			}
			rw.Write(make([]byte, 4))
		}, false},
		{"cut", func(t *testing.T, rw io.ReadWriter) {
			req := make([]byte, 32)
			io.ReadFull(rw, req)
			rw.Write(psi(4<<16|6, 1, 0x1000, 7))
		}, true},
		{"refused", nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := statetest.Store(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			id := "pc-" + c.name
			h := state.Handoff{Node: "n1", Ckpt: "fdi-" + id + "-susp", Token: strings.Repeat("s", 32)}
			src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c.source == nil || r.URL.Path != handoffPath+id+"/pages" || r.Header.Get("Authorization") != "Bearer "+h.Token ||
					r.Header.Get(nodeHeader) != "n2" || r.Header.Get("Upgrade") != pagesProtocol {
					writeJSON(w, http.StatusForbidden, apiError{Error: "no hand-over for this token"})
					return
				}
				conn, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close()
				io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+pagesProtocol+"\r\n\r\n")
				c.source(t, &idleConn{Conn: conn, r: brw.Reader})
			}))
			defer src.Close()
			sess, err := st.Register(ctx, state.Node{Name: "n1", API: strings.TrimPrefix(src.URL, "http://")}, 10)
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			recs := newFakeRecords(id)
			a, _ := testAgent(t, st, t.TempDir(), recs)
			a.c.Node.Name = "n2"
			if err := st.CreateDeployment(ctx, state.Desired{ID: id, App: "chat", Node: "n2"}); err != nil {
				t.Fatal(err)
			}
			if err := a.setStatus(ctx, id, state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n2"}}); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			ln, err := engine.ListenPages(dir)
			if err != nil {
				t.Fatal(err)
			}
			relayed := make(chan struct{})
			go func() {
				a.relayPages(ctx, id, h, ln)
				close(relayed)
			}()
			// The lazy restore's side: one page, then its close.
			conn, err := net.Dial("unix", filepath.Join(dir, engine.PagesSocket))
			if err != nil {
				t.Fatal(err)
			}
			conn.Write(psi(7, 1, 0x1000, 7))
			resp := make([]byte, 32+4096)
			if _, err := io.ReadFull(conn, resp); err == nil {
				conn.Write(psi(0x1024, 0, 0, 0))
				io.ReadFull(conn, make([]byte, 4))
			}
			conn.Close()
			select {
			case <-relayed:
			case <-time.After(20 * time.Second):
				t.Fatal("the relay did not end with its session")
			}
			want := spec.PhaseRunning
			if c.lost {
				want = spec.PhaseFailed
			}
			var d state.Deployment
			waitFor(t, "the deployment "+string(want), func() bool {
				d, err = st.Deployment(ctx, id)
				return err == nil && d.Status.Phase == want
			})
			if c.lost && !strings.Contains(d.Status.Error, "lost during migration: source node n1 failed before its memory had moved") {
				t.Errorf("a page session %s: the deployment's error %q; want it lost during its migration, its source named", c.name, d.Status.Error)
			}
			result := "done"
			if c.lost {
				result = "cut"
			}
			if got := testutil.ToFloat64(a.m.pages.sessions.WithLabelValues("target", result)); got != 1 {
				t.Errorf("fogdeploy_migrate_page_sessions_total{side=target,result=%s} = %v; want 1", result, got)
			}
			if c.lost && fmt.Sprint(recs.gone()) != "["+id+"]" {
				t.Errorf("what the node held of a lost instance: undeployed %v; want %s removed", recs.gone(), id)
			}
		})
	}
}

// TestPageSessions: a source lets a hand-over sent without its pages go
// once its page session ended, or after its bound when none came; one it
// did not send so is let go at once.
func TestPageSessions(t *testing.T) {
	var ps pageSessions
	ctx := context.Background()
	start := time.Now()
	ps.wait(ctx, "none", time.Minute)
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("wait for a hand-over sent whole: %s", d)
	}
	ps.expect("pc-1")
	go func() {
		time.Sleep(200 * time.Millisecond)
		ps.end("pc-1")
	}()
	start = time.Now()
	ps.wait(ctx, "pc-1", time.Minute)
	if d := time.Since(start); d < 150*time.Millisecond || d > 5*time.Second {
		t.Errorf("wait for a page session that ended after 200 ms: %s", d)
	}
	ps.expect("pc-2")
	start = time.Now()
	ps.wait(ctx, "pc-2", 300*time.Millisecond)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("wait for a page session that never came: %s; want its bound", d)
	}
	ps.wait(ctx, "pc-2", time.Minute) // given up: not waited for again
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a page session given up on is waited for again")
	}
}

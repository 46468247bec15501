package engine

import (
	"bytes"
	"strings"
	"sync"
)

// maxLine bounds a line kept by a LogTail; longer lines are cut.
const maxLine = 4096

// LogTail is an io.Writer that keeps the last lines written to it (a ring
// buffer) and tells watchers when a phrase appears. Put it behind an app's
// Stdout/Stderr (io.MultiWriter) to give readiness errors the app's last
// words and to wait for a phrase with OutputProbe. It is safe for
// concurrent use.
type LogTail struct {
	mu      sync.Mutex
	lines   []string // ring of complete lines
	next    int      // index of the slot to overwrite once the ring is full
	partial []byte   // the current line, not yet ended by '\n'
	total   int      // complete lines ever written
	watches []*watch
}

type watch struct {
	phrase string
	seen   chan struct{}
	done   bool
}

// NewLogTail returns a LogTail that keeps the last n lines (n < 1 means 50).
func NewLogTail(n int) *LogTail {
	if n < 1 {
		n = 50
	}
	return &LogTail{lines: make([]string, 0, n)}
}

// Write implements io.Writer. It never fails.
func (t *LogTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			t.partial = appendCapped(t.partial, rest)
			break
		}
		t.partial = appendCapped(t.partial, rest[:i])
		t.push(strings.TrimRight(string(t.partial), "\r"))
		t.partial = t.partial[:0]
		rest = rest[i+1:]
	}
	// A prompt without a newline counts too.
	if len(t.partial) > 0 {
		t.match(string(t.partial))
	}
	return len(p), nil
}

func appendCapped(b, p []byte) []byte {
	if room := maxLine - len(b); room < len(p) {
		if room <= 0 {
			return b
		}
		p = p[:room]
	}
	return append(b, p...)
}

func (t *LogTail) push(line string) {
	t.total++
	if len(t.lines) < cap(t.lines) {
		t.lines = append(t.lines, line)
	} else {
		t.lines[t.next] = line
		t.next = (t.next + 1) % len(t.lines)
	}
	t.match(line)
}

func (t *LogTail) match(line string) {
	for _, w := range t.watches {
		if !w.done && strings.Contains(line, w.phrase) {
			w.done = true
			close(w.seen)
		}
	}
}

// Lines returns the kept lines, oldest first, plus the unfinished last line.
func (t *LogTail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.lines)+1)
	out = append(out, t.lines[t.next:]...)
	out = append(out, t.lines[:t.next]...)
	if len(t.partial) > 0 {
		out = append(out, string(t.partial))
	}
	return out
}

// Last returns at most n of the last lines.
func (t *LogTail) Last(n int) []string {
	l := t.Lines()
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return l
}

// String returns the kept lines joined by newlines.
func (t *LogTail) String() string { return strings.Join(t.Lines(), "\n") }

// Watch returns a channel that is closed once a line containing phrase has
// been written: already (among the kept lines) or in the future.
func (t *LogTail) Watch(phrase string) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := &watch{phrase: phrase, seen: make(chan struct{})}
	t.watches = append(t.watches, w)
	for _, l := range t.lines {
		t.match(l)
	}
	if len(t.partial) > 0 {
		t.match(string(t.partial))
	}
	return w.seen
}

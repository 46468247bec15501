package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// timings writes one JSON object per line for each phase the entrypoint
// goes through, so that the agent (or a person) can read where the time of
// a deploy or restore went:
//
//	{"time":"...","phase":"checkpoint","mode":"launch","gen":1,"ms":531.2,"bytes":35123200}
type timings struct {
	mu   sync.Mutex
	w    io.Writer
	mode string
}

// timing is one line of the timings stream.
type timing struct {
	Time  time.Time `json:"time"`
	Phase string    `json:"phase"`
	Mode  string    `json:"mode"`
	Gen   int       `json:"gen,omitempty"`
	MS    float64   `json:"ms"`
	Bytes int64     `json:"bytes,omitempty"`
	Error string    `json:"error,omitempty"`
}

func openTimings(path string) (io.Writer, func(), error) {
	if path == "" || path == "-" {
		return os.Stdout, func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("open timings file: %w", err)
	}
	return f, func() { _ = f.Close() }, nil
}

// record writes the phase that started at since and ends now.
func (t *timings) record(phase string, gen int, since time.Time, bytes int64, err error) {
	line := timing{Time: time.Now().UTC(), Phase: phase, Mode: t.mode, Gen: gen, Bytes: bytes,
		MS: float64(time.Since(since).Microseconds()) / 1000}
	if err != nil {
		line.Error = err.Error()
	}
	b, _ := json.Marshal(line)
	t.mu.Lock()
	defer t.mu.Unlock()
	_, _ = t.w.Write(append(b, '\n'))
}

package runtime

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
)

// startsRefused is a dockerd whose first refusals of a start are a
// published port that another process bound.
type startsRefused struct {
	DockerClient
	refusals, starts int
	err              error
}

func (s *startsRefused) ContainerStart(context.Context, string, container.StartOptions) error {
	s.starts++
	if s.starts <= s.refusals {
		return s.err
	}
	return nil
}

// TestStartPortTaken: a start that dockerd refuses because the host port
// it picked was bound by another process meanwhile is tried again, and
// succeeds once dockerd picks a free one; it gives up after startAttempts;
// any other refusal is not tried again.
func TestStartPortTaken(t *testing.T) {
	taken := errors.New("Error response from daemon: driver failed programming external connectivity on endpoint fd-x: Error starting userland proxy: listen tcp4 127.0.0.1:32777: bind: address already in use")
	for _, c := range []struct {
		refusals   int
		err        error
		starts     int
		wantFailed bool
	}{
		{1, taken, 2, false},
		{startAttempts - 1, taken, startAttempts, false},
		{startAttempts, taken, startAttempts, true},
		{1, errors.New("Error response from daemon: no such image"), 1, true},
	} {
		api := &startsRefused{refusals: c.refusals, err: c.err}
		err := NewDocker(api, slog.New(slog.DiscardHandler)).Start(context.Background(), "0123456789abcdef")
		if api.starts != c.starts || (err != nil) != c.wantFailed || (err != nil && !strings.Contains(err.Error(), c.err.Error())) {
			t.Errorf("%d refusals (%v): %d starts, %v; want %d starts, failed %v", c.refusals, c.err, api.starts, err, c.starts, c.wantFailed)
		}
	}
}

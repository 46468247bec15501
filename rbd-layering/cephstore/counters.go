//go:build !no_ceph

package cephstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// IOCounters are cumulative client I/O at the OSDs, summed over all OSDs
// that are up: bytes read by clients (op_r_out_bytes) and written by them
// (op_w_in_bytes). They only grow while the OSDs run; the difference of two
// readings is what the cluster served in between.
type IOCounters struct {
	Read    uint64 `json:"read"`
	Written uint64 `json:"written"`
	OSDs    int    `json:"osds"`
}

// Sub returns the bytes moved between an earlier reading o and c.
func (c IOCounters) Sub(o IOCounters) IOCounters {
	return IOCounters{Read: c.Read - o.Read, Written: c.Written - o.Written, OSDs: c.OSDs}
}

// IOCounters reads the OSDs' own I/O counters, from the OSDs that the
// monitors report up (a down OSD would only time out).
//
// Implements: mon "osd dump"; osd "perf dump" (logger osd).
func (s *Store) IOCounters(ctx context.Context) (IOCounters, error) {
	var dump osdDump
	if err := s.monJSON(ctx, map[string]any{"prefix": "osd dump", "format": "json"}, &dump); err != nil {
		return IOCounters{}, err
	}
	se, err := s.acquire()
	if err != nil {
		return IOCounters{}, err
	}
	defer s.release(se)
	var c IOCounters
	cmd, _ := json.Marshal(map[string]any{"prefix": "perf dump", "logger": "osd", "format": "json"})
	for _, o := range dump.OSDs {
		if o.Up == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return c, err
		}
		out, status, err := se.conn.OsdCommand(o.ID, [][]byte{cmd})
		if err != nil {
			return c, wrap("osd."+strconv.Itoa(o.ID)+" perf dump", fmt.Errorf("%w (%s)", err, status))
		}
		b, err := parsePerfDump(out)
		if err != nil {
			return c, fmt.Errorf("osd.%d perf dump: %w", o.ID, err)
		}
		c.Read += b.Read
		c.Written += b.Written
		c.OSDs++
	}
	return c, nil
}

func (s *Store) monJSON(ctx context.Context, cmd map[string]any, v any) error {
	se, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.release(se)
	if err := ctx.Err(); err != nil {
		return err
	}
	raw, _ := json.Marshal(cmd)
	out, status, err := se.conn.MonCommand(raw)
	if err != nil {
		return wrap(fmt.Sprint(cmd["prefix"]), fmt.Errorf("%w (%s)", err, status))
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("%w: %s: %v", layering.ErrInvalid, cmd["prefix"], err)
	}
	return nil
}

func parsePerfDump(raw []byte) (IOCounters, error) {
	var d struct {
		OSD *struct {
			Read    *uint64 `json:"op_r_out_bytes"`
			Written *uint64 `json:"op_w_in_bytes"`
		} `json:"osd"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return IOCounters{}, fmt.Errorf("%w: %v", layering.ErrInvalid, err)
	}
	if d.OSD == nil || d.OSD.Read == nil || d.OSD.Written == nil {
		return IOCounters{}, fmt.Errorf("%w: no osd.op_r_out_bytes or osd.op_w_in_bytes", layering.ErrInvalid)
	}
	return IOCounters{Read: *d.OSD.Read, Written: *d.OSD.Written}, nil
}

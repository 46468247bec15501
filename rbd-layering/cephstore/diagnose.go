//go:build !no_ceph

package cephstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// diagnosisTTL is how long a diagnosis is reused: the failing operations of
// one deploy (clone, then the removal of what it made) share one.
const diagnosisTTL = 5 * time.Second

type diagnosis struct {
	at  time.Time
	err error
}

// wrap is the package's wrap, and for an operation that timed out (the
// cluster did not serve it within Config.Timeout) it asks the cluster why
// and says so: a full pool (wrapping layering.ErrFull) or OSDs down, each
// with a hint.
func (s *Store) wrap(ctx context.Context, op string, err error) error {
	werr := wrap(op, err)
	if errno(err) != eTIMEDOUT {
		return werr
	}
	if why := s.Diagnose(ctx); why != nil {
		return fmt.Errorf("%s: no answer from Ceph within %s: %w (ceph: %w)", op, s.cfg.Timeout, why, err)
	}
	return hint.With(werr, "Ceph did not answer within "+s.cfg.Timeout.String()+": `ceph -s` and `ceph health detail` say why")
}

// Diagnose implements layering.Diagnoser: it asks the monitors (within
// Config.Timeout) why I/O on the pool may not be served. A full pool (its
// quota reached, or an OSD past its full ratio) wraps layering.ErrFull;
// OSDs down wrap layering.ErrUnavailable; both carry a hint. It returns
// nil when the cluster reports neither, or cannot be asked.
//
// Implements: mon "osd dump".
func (s *Store) Diagnose(ctx context.Context) error {
	s.diagMu.Lock()
	defer s.diagMu.Unlock()
	if !s.diag.at.IsZero() && time.Since(s.diag.at) < diagnosisTTL {
		return s.diag.err
	}
	var dump osdDump
	if err := s.monJSON(ctx, map[string]any{"prefix": "osd dump", "format": "json"}, &dump); err != nil {
		return nil
	}
	s.diag = diagnosis{at: time.Now(), err: dump.explain(s.cfg.Pool)}
	return s.diag.err
}

// osdDump is the part of `ceph osd dump -f json` that Diagnose reads.
type osdDump struct {
	Pools []struct {
		Name         string `json:"pool_name"`
		Flags        string `json:"flags_names"`
		QuotaBytes   int64  `json:"quota_max_bytes"`
		QuotaObjects int64  `json:"quota_max_objects"`
	} `json:"pools"`
	OSDs []struct {
		ID int `json:"osd"`
		Up int `json:"up"`
	} `json:"osds"`
}

func (d osdDump) explain(pool string) error {
	for _, p := range d.Pools {
		if p.Name != pool {
			continue
		}
		flags := strings.Split(p.Flags, ",")
		switch {
		case slices.Contains(flags, "full_quota"):
			var quota []string
			if p.QuotaBytes > 0 {
				quota = append(quota, "max_bytes "+layering.FormatSize(p.QuotaBytes))
			}
			if p.QuotaObjects > 0 {
				quota = append(quota, fmt.Sprintf("max_objects %d", p.QuotaObjects))
			}
			return hint.With(fmt.Errorf("pool %q is full: its quota (%s) is used up: %w", pool, strings.Join(quota, ", "), layering.ErrFull),
				fmt.Sprintf("free space in the pool (`fogctl undeploy`, `fogctl gc`, `fogctl env prune`) or raise its quota: `ceph osd pool set-quota %s max_bytes BYTES` (0: no limit)", pool))
		case slices.Contains(flags, "full"):
			return hint.With(fmt.Errorf("pool %q is full: an OSD is past its full ratio: %w", pool, layering.ErrFull),
				"add OSDs or free space in the cluster; `ceph health detail` names the full OSDs")
		}
	}
	var down []string
	for _, o := range d.OSDs {
		if o.Up == 0 {
			down = append(down, fmt.Sprintf("osd.%d", o.ID))
		}
	}
	if len(down) > 0 {
		return hint.With(fmt.Errorf("%d of %d OSDs down (%s): %w", len(down), len(d.OSDs), strings.Join(down, ", "), layering.ErrUnavailable),
			"start the OSDs again (`ceph osd tree` shows which are down); what a failed deploy left is removed once the cluster answers")
	}
	return nil
}

package agent

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/ksm"
)

// startMemoryMerge turns the node's same-page merging (n) on for the
// slots restored ahead (agent.memory_merge) and exports what it saves. An
// operator who asked for it on a kernel that cannot is told at start.
func startMemoryMerge(m config.MemoryMerge, n ksm.Node, reg prometheus.Registerer, log *slog.Logger) error {
	if !m.Enabled {
		return nil
	}
	if err := n.Enable(m.Settings()); err != nil {
		return hint.With(err, "agent.memory_merge needs a kernel built with CONFIG_KSM (Linux >= 6.7) and a writable /sys/kernel/mm/ksm; or set agent.memory_merge.enabled: false")
	}
	log.Info("same-page merging on for slots restored ahead", "pages_to_scan", m.PagesToScan)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fogdeploy_memory_merged_bytes",
		Help: "Memory the node's same-page merging saves (pages_sharing): slots restored ahead sharing the pages of their checkpoint (agent.memory_merge).",
	}, func() float64 {
		s, err := n.Stats()
		if err != nil {
			return 0
		}
		return float64(s.SavedBytes())
	}))
	return nil
}

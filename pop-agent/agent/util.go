package agent

import (
	"encoding/json"
	"net/http"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

func phaseOf(name string, d time.Duration) layering.Phase {
	return layering.Phase{Name: name, Duration: d}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

package deploy_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// fileServer writes a page into a directory it makes in its root, changes
// into it and serves it, as busybox httpd -h does: a restored instance
// must find the page, in the directory it runs in.
var fileServer = []string{"/bin/sh", "-c", `mkdir -p /www/app && echo "page of $(date +%s%N)" > /www/app/index.html && cd /www/app && exec python3 -c '
import http.server, os
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()'`}

// TestFilesWrittenBeforeCheckpoint: what the app wrote into its root before
// its checkpoint (a directory it made, a file in it) and the working
// directory it moved to are what every restored instance has, under each
// engine: the server answers with the page, not 404 (DMTCP 4.2 restored
// the working directory only below a launch directory other than "/":
// scripts/patches/dmtcp-4.2.0-restart-cwd.patch).
func TestFilesWrittenBeforeCheckpoint(t *testing.T) {
	f := deploytest.NewPythonFixture(t)
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, _, err := f.D.Drivers().CheckEngine(ctx, eng); err != nil {
				testenv.Unavailable(t, string(eng), err.Error())
			}
			app := spec.App{
				Name: "files-" + string(eng) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36), Env: f.Env, Engine: eng,
				Command:   fileServer,
				Ports:     []spec.Port{{Port: 8000}},
				Ready:     spec.Readiness{Kind: spec.ReadyHTTP, Port: 8000, Path: "/", Timeout: spec.Duration(60 * time.Second)},
				Resources: spec.Resources{CPUs: 1, Memory: "256M"},
			}
			t.Cleanup(func() { f.UndeployAll(t, app.Name); f.RemoveGenerations(t, app.Name) })
			get := func(dep deploy.Deployment) (int, string) {
				t.Helper()
				resp, err := http.Get("http://" + dep.Ports[drivers.PortKey(8000, "tcp")] + "/index.html")
				if err != nil {
					t.Fatalf("GET /index.html of %s: %v", dep.ID, err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			first, err := f.D.Deploy(ctx, app, deploy.Options{})
			if err != nil {
				t.Fatalf("first deploy: %v", err)
			}
			code, page := get(first)
			if code != 200 {
				t.Fatalf("first deploy (%s, booted %v) answers %d: %q", first.Mode, first.Booted, code, page)
			}
			second, err := f.D.Deploy(ctx, app, deploy.Options{})
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if c, p := get(second); c != 200 || p != page {
				t.Fatalf("restored instance answers %d %q; want 200 and the page written before the checkpoint, %q", c, p, page)
			}
		})
	}
}

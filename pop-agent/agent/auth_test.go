package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// credentials writes the operator's token (if any) and a tokens file of
// entries (if any) in a temporary directory, lets mod change the config,
// and loads them as the agent does at its start.
func credentials(t *testing.T, operator, entries string, mod func(*config.Config, *Options)) apiSecurity {
	t.Helper()
	sec, err := tryCredentials(t, operator, entries, mod)
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

func tryCredentials(t *testing.T, operator, entries string, mod func(*config.Config, *Options)) (apiSecurity, error) {
	t.Helper()
	dir := t.TempDir()
	c := config.Default()
	o := Options{Listen: "127.0.0.1:0"}
	if operator != "" {
		c.Agent.TokenFile = filepath.Join(dir, "token")
		if err := os.WriteFile(c.Agent.TokenFile, []byte(operator+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if entries != "" {
		c.Agent.TokensFile = filepath.Join(dir, "tokens.yaml")
		if err := os.WriteFile(c.Agent.TokensFile, []byte(entries), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if mod != nil {
		mod(&c, &o)
	}
	return loadAPISecurity(c, o, time.Now(), slog.New(slog.DiscardHandler))
}

// entry is a tokens file entry of client name with token tok.
func entry(name, tok, rest string) string {
	return "- name: " + name + "\n  sha256: " + apiauth.Hash(tok) + "\n" + rest
}

// caller sends requests to an API server with one token.
type caller struct {
	t      *testing.T
	url    string
	client *http.Client
}

func (c caller) do(method, path, tok, body string) (int, http.Header, map[string]any) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.url+path, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if len(b) > 0 && b[0] == '{' {
		if err := json.Unmarshal(b, &v); err != nil {
			c.t.Fatalf("%s %s: %d, not JSON: %s", method, path, resp.StatusCode, b)
		}
	} else {
		v = map[string]any{"raw": string(b)}
	}
	return resp.StatusCode, resp.Header, v
}

// serveHooks serves h's hook API until the test ends, and returns a caller
// of it.
func serveHooks(t *testing.T, h *hooks) caller {
	t.Helper()
	mux := http.NewServeMux()
	h.register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return caller{t: t, url: srv.URL, client: srv.Client()}
}

// hookStore is an etcd with apps and node n1 of capacity registered, as
// the hook API's tests need them.
func hookStore(t *testing.T, capacity int, apps ...string) *state.Store {
	t.Helper()
	st := statetest.Store(t)
	ctx := context.Background()
	for _, app := range apps {
		if err := st.CreateApp(ctx, spec.App{Name: app, Env: "e", Command: []string{"x"},
			Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Register(ctx, state.Node{Name: "n1", Capacity: capacity}, 10); err != nil {
		t.Fatal(err)
	}
	return st
}

// keys counts every key of the PoP's state (deployments, statuses,
// events): what a refused request must not change.
func keys(t *testing.T, st *state.Store) int64 {
	t.Helper()
	return statetest.Count(context.Background(), t, st, "")
}

// Per-client tokens: a client scoped to an app and a label creates only
// deployments of that app carrying the label, and lists, reads, logs and
// deletes only the ones it created (403 with a JSON error and a hint for
// another's); an unknown token is a 401; a burst beyond a client's rate is
// a 429 with Retry-After; a refused request writes nothing.
func TestScopedTokens(t *testing.T) {
	st := hookStore(t, 50, "chat", "db")
	ctx := context.Background()
	const operator = "0123456789abcdef-operator"
	alice, bob, dba, slow := apiauth.NewToken(), apiauth.NewToken(), apiauth.NewToken(), apiauth.NewToken()
	sec := credentials(t, operator,
		entry("chat-a", alice, "  apps: [chat]\n  label: user\n  rate: 1000\n")+
			entry("chat-b", bob, "  apps: [chat]\n  label: user\n  rate: 1000\n")+
			entry("dba", dba, "  apps: [db]\n  rate: 1000\n")+
			entry("slow", slow, "  apps: [chat]\n  rate: 0.5\n  burst: 2\n"), nil)
	now := time.Unix(1e9, 0)
	h := &hooks{a: &agent{st: st}, keys: sec.keys, now: func() time.Time { return now }}
	mux := http.NewServeMux()
	h.register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	api := caller{t: t, url: srv.URL, client: srv.Client()}

	create := func(tok, body string) string {
		t.Helper()
		code, _, v := api.do("POST", "/v1/deployments", tok, body)
		if code != 201 {
			t.Fatalf("create %s: %d %v", body, code, v)
		}
		return v["id"].(string)
	}
	mineA := create(alice, `{"app":"chat","labels":{"user":"alice"}}`)
	mineB := create(bob, `{"app":"chat","labels":{"user":"bob"}}`)
	ops := create(operator, `{"app":"db"}`)
	for id, client := range map[string]string{mineA: "chat-a", mineB: "chat-b", ops: apiauth.OperatorName} {
		if d, err := st.Deployment(ctx, id); err != nil || d.Client != client {
			t.Errorf("deployment %s: client %q, %v; want %q", id, d.Client, err, client)
		}
	}

	before := keys(t, st)
	for _, tc := range []struct {
		name, method, path, tok, body string
		code                          int
		want                          string // in the error
	}{
		{"no token", "GET", "/v1/deployments", "", "", 401, "bearer token"},
		{"unknown token", "GET", "/v1/deployments/" + mineA, apiauth.NewToken(), "", 401, "bearer token"},
		{"a hash as a token", "GET", "/v1/deployments", apiauth.Hash(alice), "", 401, "bearer token"},
		{"another app", "POST", "/v1/deployments", alice, `{"app":"db","labels":{"user":"alice"}}`, 403, "client chat-a may deploy chat only"},
		{"without the label", "POST", "/v1/deployments", alice, `{"app":"chat"}`, 403, "labels.user is missing"},
		{"with another label", "POST", "/v1/deployments", alice, `{"app":"chat","labels":{"team":"x"}}`, 403, "labels.user is missing"},
		{"read another's", "GET", "/v1/deployments/" + mineB, alice, "", 403, "not one of client chat-a's"},
		{"logs of another's", "GET", "/v1/deployments/" + mineB + "/logs", alice, "", 403, "not one of client chat-a's"},
		{"delete another's", "DELETE", "/v1/deployments/" + mineB, alice, "", 403, "not one of client chat-a's"},
		{"read the operator's", "GET", "/v1/deployments/" + ops, alice, "", 403, "not one of client chat-a's"},
		{"another app's", "GET", "/v1/deployments/" + mineA, dba, "", 403, "not one of client dba's"},
		{"another client's of its app, no label", "GET", "/v1/deployments/" + ops, dba, "", 403, "not one of client dba's"},
		{"delete another client's of its app", "DELETE", "/v1/deployments/" + ops, dba, "", 403, "not one of client dba's"},
		{"delete another app's", "DELETE", "/v1/deployments/" + mineA, dba, "", 403, "not one of client dba's"},
		{"logs of another app's", "GET", "/v1/deployments/" + mineA + "/logs?tail=5", dba, "", 403, "not one of client dba's"},
		{"unknown deployment", "GET", "/v1/deployments/chat-00000000", alice, "", 404, "not found"},
		{"delete unknown", "DELETE", "/v1/deployments/chat-00000000", alice, "", 404, "not found"},
	} {
		code, hdr, v := api.do(tc.method, tc.path, tc.tok, tc.body)
		msg, _ := v["error"].(string)
		if code != tc.code || !strings.Contains(msg, tc.want) || hdr.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %v; want %d saying %q", tc.name, code, v, tc.code, tc.want)
		}
		if code == 403 && v["hint"] == nil {
			t.Errorf("%s: 403 without a hint: %v", tc.name, v)
		}
		if code == 401 && hdr.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", tc.name)
		}
	}
	if after := keys(t, st); after != before {
		t.Errorf("refused requests changed the state: %d keys, then %d", before, after)
	}

	// Lists: each client its own, with a label or without (another
	// client's deployment of its apps is not its); the operator all.
	list := func(tok string) []string {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/v1/deployments", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var deps []state.Deployment
		if err := json.NewDecoder(resp.Body).Decode(&deps); err != nil || resp.StatusCode != 200 {
			t.Fatalf("list: %d %v", resp.StatusCode, err)
		}
		var ids []string
		for _, d := range deps {
			ids = append(ids, d.ID)
		}
		return ids
	}
	for tok, want := range map[string][]string{alice: {mineA}, bob: {mineB}, dba: nil, operator: {mineA, mineB, ops}, slow: nil} {
		if got := list(tok); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("list = %v; want %v", got, want)
		}
	}
	if code, _, v := api.do("GET", "/v1/deployments/"+mineA, alice, ""); code != 200 || v["id"] != mineA || v["client"] != "chat-a" {
		t.Errorf("read its own: %d %v", code, v)
	}
	if code, _, v := api.do("DELETE", "/v1/deployments/"+mineA, alice, ""); code != 202 {
		t.Errorf("delete its own: %d %v", code, v)
	}
	if _, err := st.Deployment(ctx, mineA); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("deployment %s after its client deleted it: %v", mineA, err)
	}
	if code, _, v := api.do("DELETE", "/v1/deployments/"+mineB, operator, ""); code != 202 {
		t.Errorf("the operator deletes any: %d %v", code, v)
	}

	// Rate: a burst of 2 at 0.5/s (full again after 4 s); the third is a
	// 429 that writes nothing.
	now = now.Add(4 * time.Second)
	for i := range 2 {
		if code, _, v := api.do("GET", "/v1/deployments", slow, ""); code != 200 {
			t.Fatalf("request %d of the burst: %d %v", i+1, code, v)
		}
	}
	before = keys(t, st)
	for _, req := range [][3]string{{"GET", "/v1/deployments", ""}, {"POST", "/v1/deployments", `{"app":"chat"}`}} {
		code, hdr, v := api.do(req[0], req[1], slow, req[2])
		if code != 429 || hdr.Get("Retry-After") != "2" || !strings.Contains(v["error"].(string), "rate limit") {
			t.Errorf("%s beyond the burst: %d, Retry-After %q, %v; want 429 with Retry-After 2", req[0], code, hdr.Get("Retry-After"), v)
		}
	}
	if after := keys(t, st); after != before {
		t.Errorf("a rate-limited create changed the state: %d keys, then %d", before, after)
	}
	// Other clients keep their own rates.
	if code, _, _ := api.do("GET", "/v1/deployments", dba, ""); code != 200 {
		t.Errorf("another client while one is limited: %d", code)
	}
	now = now.Add(2 * time.Second)
	if code, _, v := api.do("POST", "/v1/deployments", slow, `{"app":"chat"}`); code != 201 {
		t.Errorf("after Retry-After: %d %v", code, v)
	}
}

// /healthz tells a caller without a token its status only, and /metrics
// (whose series name apps) needs an admin's token or metrics: true, except
// under --dev.
func TestHealthzAndMetricsHideNames(t *testing.T) {
	const operator = "0123456789abcdef-operator"
	chat, reader := apiauth.NewToken(), apiauth.NewToken()
	sec := credentials(t, operator, entry("chat", chat, "  apps: [chat]\n")+entry("prom", reader, "  apps: [chat]\n  metrics: true\n"), nil)
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.poolIdle.WithLabelValues("secret-app").Set(2)
	full := func() map[string]any {
		return map[string]any{"status": "ok", "etcd": "ok", "node": "n1", "mapper": "fuse", "engines": []string{"dmtcp"}, "version": "v1",
			"apps": []string{"secret-app"}} // as if a later version named them
	}
	serve := func(h *hooks) caller {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", h.healthz(full))
		mux.Handle("GET /metrics", h.metrics(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return caller{t: t, url: srv.URL, client: srv.Client()}
	}
	api := serve(&hooks{keys: sec.keys})
	for _, tok := range []string{"", "wrong-token-0123456789"} {
		code, _, v := api.do("GET", "/healthz", tok, "")
		if code != 200 || len(v) != 4 || v["status"] != "ok" || v["etcd"] != "ok" || v["node"] != "n1" || v["version"] != "v1" {
			t.Errorf("/healthz with token %q: %d %v; want status, etcd, node and version only", tok, code, v)
		}
	}
	if code, _, v := api.do("GET", "/healthz", chat, ""); code != 200 || len(v) != 7 {
		t.Errorf("/healthz with a token: %d %v; want the full body", code, v)
	}
	for _, tc := range []struct {
		tok  string
		code int
	}{{"", 401}, {"wrong-token-0123456789", 401}, {chat, 403}, {reader, 200}, {operator, 200}} {
		code, _, v := api.do("GET", "/metrics", tc.tok, "")
		leaks := strings.Contains(toJSON(v), "secret-app")
		if code != tc.code || leaks != (tc.code == 200) {
			t.Errorf("/metrics with token %q: %d (names the app: %v); want %d", tc.tok, code, leaks, tc.code)
		}
	}
	dev := serve(&hooks{openMetrics: true})
	if code, _, v := dev.do("GET", "/metrics", "", ""); code != 200 || !strings.Contains(toJSON(v), `secret-app`) {
		t.Errorf("/metrics under --dev: %d", code)
	}
	if code, _, v := dev.do("GET", "/healthz", "", ""); code != 200 || len(v) != 7 {
		t.Errorf("/healthz under --dev without a token: %d %v; want the full body", code, v)
	}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TLS: the listener serves HTTPS with the configured certificate; a plain
// HTTP request to it fails and writes nothing; a client that does not
// trust the certificate fails; one verified against it works.
func TestTLSListener(t *testing.T) {
	st := hookStore(t, 4, "web")
	const operator = "0123456789abcdef-operator"
	certFile, keyFile := selfSigned(t, t.TempDir(), time.Now().Add(time.Hour))
	sec := credentials(t, operator, "", func(c *config.Config, o *Options) {
		c.Agent.TLSCertFile, c.Agent.TLSKeyFile = certFile, keyFile
		o.Listen = "0.0.0.0:7480" // allowed with TLS
	})
	if sec.tls == nil || sec.tls.MinVersion != tls.VersionTLS12 {
		t.Fatalf("TLS config = %+v", sec.tls)
	}
	mux := http.NewServeMux()
	(&hooks{a: &agent{st: st}, keys: sec.keys}).register(mux)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, TLSConfig: sec.tls, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer srv.Close()
	addr := ln.Addr().String()

	before := keys(t, st)
	plain := caller{t: t, url: "http://" + addr, client: &http.Client{Timeout: 5 * time.Second}}
	req, _ := http.NewRequest("POST", plain.url+"/v1/deployments", strings.NewReader(`{"app":"web"}`))
	req.Header.Set("Authorization", "Bearer "+operator)
	if resp, err := plain.client.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS") {
			t.Errorf("plain HTTP to the TLS listener: %d %s; want a failure", resp.StatusCode, b)
		}
	}
	if after := keys(t, st); after != before {
		t.Errorf("a plain HTTP request changed the state: %d keys, then %d", before, after)
	}

	untrusted := &http.Client{Timeout: 5 * time.Second}
	if _, err := untrusted.Get("https://" + addr + "/v1/deployments"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("HTTPS without trusting the certificate = %v; want a verification error", err)
	}
	cfg, err := apiauth.ClientTLS(certFile)
	if err != nil {
		t.Fatal(err)
	}
	api := caller{t: t, url: "https://" + addr, client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}}
	if code, _, v := api.do("POST", "/v1/deployments", operator, `{"app":"web"}`); code != 201 {
		t.Errorf("HTTPS create, verified: %d %v", code, v)
	}
	if code, _, _ := api.do("GET", "/v1/deployments", "", ""); code != 401 {
		t.Errorf("HTTPS without a token: %d; want 401", code)
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and localhost
// valid until notAfter, and its key (mode 0600), in dir.
func selfSigned(t *testing.T, dir string, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "pop-agent test"},
		NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// The agent refuses to start with credentials it cannot use, saying which
// file, entry and field.
func TestCredentialsRefused(t *testing.T) {
	tok := apiauth.NewToken()
	dir := t.TempDir()
	cert, key := selfSigned(t, dir, time.Now().Add(time.Hour))
	oldDir := filepath.Join(dir, "old")
	os.Mkdir(oldDir, 0o700)
	oldCert, oldKey := selfSigned(t, oldDir, time.Now().Add(-time.Hour))
	for _, tc := range []struct {
		name, operator, entries string
		mod                     func(*config.Config, *Options)
		want                    []string
	}{
		{"a bad entry", "", entry("good", tok, "  apps: [chat]\n") + "- name: bad\n  sha256: " + apiauth.NewToken() + "\n  apps: [chat]\n", nil,
			[]string{"entry 2 (bad): sha256"}},
		{"an entry without apps", "", entry("none", tok, ""), nil, []string{"entry 1 (none): apps is empty"}},
		{"a short operator token", "short", "", nil, []string{"agent.token_file", "shorter than 16"}},
		{"the operator's token among the clients", "0123456789abcdef-operator", entry("dup", "0123456789abcdef-operator", "  apps: [chat]\n"), nil,
			[]string{"same token"}},
		{"plain beyond loopback", "0123456789abcdef-operator", "", func(c *config.Config, o *Options) { o.Listen = "0.0.0.0:7480" },
			[]string{"--listen 0.0.0.0:7480 without TLS", "agent.tls_cert_file"}},
		{"--dev beyond loopback", "", "", func(c *config.Config, o *Options) { o.Listen, o.Dev = "192.0.2.1:7480", true },
			[]string{"--listen 192.0.2.1:7480 without TLS"}},
		{"no token outside --dev", "", "", nil, []string{"agent.token_file and agent.tokens_file are empty"}},
		{"a key others read", "0123456789abcdef-operator", "", func(c *config.Config, o *Options) {
			os.Chmod(key, 0o644)
			c.Agent.TLSCertFile, c.Agent.TLSKeyFile = cert, key
		}, []string{"agent.tls_key_file", "chmod 600"}},
		{"an expired certificate", "0123456789abcdef-operator", "", func(c *config.Config, o *Options) {
			c.Agent.TLSCertFile, c.Agent.TLSKeyFile = oldCert, oldKey
		}, []string{"agent.tls_cert_file", "expired"}},
		{"a key that is not", "0123456789abcdef-operator", "", func(c *config.Config, o *Options) {
			c.Agent.TLSCertFile, c.Agent.TLSKeyFile = cert, c.Agent.TokenFile
		}, []string{"agent.tls_cert_file", "agent.tls_key_file", "PEM"}},
	} {
		_, err := tryCredentials(t, tc.operator, tc.entries, tc.mod)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v; want %q", tc.name, err, w)
			}
		}
	}
	// --dev on loopback needs nothing; every caller is an admin then.
	if sec, err := tryCredentials(t, "", "", func(c *config.Config, o *Options) { o.Dev = true }); err != nil || sec.keys != nil || sec.tls != nil {
		t.Errorf("--dev on loopback = %+v, %v", sec, err)
	}
}

// `pop-agent token` prints a token once on stdout and its entry (with the
// hash only), or appends the entry to a tokens file, which the agent then
// accepts.
func TestTokenCommand(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.yaml")
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Main(append([]string{"token"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := run("--name", "chat", "--apps", "chat,notes", "--label", "user", "--rate", "5", "--burst", "10")
	tok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(tok, apiauth.TokenPrefix) || strings.Contains(errOut, tok) || !strings.Contains(errOut, apiauth.Hash(tok)) {
		t.Fatalf("token = exit %d, %q\n%s", code, out, errOut)
	}
	code, out, errOut = run("--name", "chat", "--apps", "chat", "--label", "user", "--append", file)
	if code != 0 {
		t.Fatalf("token --append = exit %d\n%s", code, errOut)
	}
	tokA := strings.TrimSpace(out)
	if code, out, _ = run("--name", "ops", "--admin", "--append", file); code != 0 {
		t.Fatalf("token --admin --append = exit %d", code)
	}
	tokOps := strings.TrimSpace(out)
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("tokens file: %v, %v; want mode 0600", fi, err)
	}
	b, _ := os.ReadFile(file)
	if strings.Contains(string(b), tokA) || strings.Contains(string(b), tokOps) {
		t.Fatalf("the tokens file holds a token:\n%s", b)
	}
	sec := credentials(t, "", "", func(c *config.Config, o *Options) { c.Agent.TokensFile = file })
	if c, err := sec.keys.Authenticate(tokA); err != nil || c.Name != "chat" || c.Label != "user" || c.Admin {
		t.Errorf("minted chat token = %+v, %v", c, err)
	}
	if c, err := sec.keys.Authenticate(tokOps); err != nil || !c.Admin {
		t.Errorf("minted admin token = %+v, %v", c, err)
	}
	if code, _, errOut := run("--name", "chat", "--apps", "chat", "--append", file); code != 1 || !strings.Contains(errOut, "has a client chat already") {
		t.Errorf("a second chat = exit %d\n%s", code, errOut)
	}
	if code, out, errOut := run("--name", "x"); code != 2 || out != "" || !strings.Contains(errOut, "apps is empty") {
		t.Errorf("token without apps = exit %d %q\n%s", code, out, errOut)
	}
	if code, _, errOut := run("--name", "x", "--apps", "a", "--rate", "-3"); code != 2 || !strings.Contains(errOut, "rate -3") {
		t.Errorf("token --rate -3 = exit %d\n%s", code, errOut)
	}
	if code, _, _ := run("--name", "x", "extra"); code != 2 {
		t.Errorf("token with an argument = exit %d", code)
	}
}

// A client's long polls and migrations are bounded by its token: 200
// long polls at once from one client hold its bound (waits: 4) and the
// rest are 429s at once with a hint, a create with ?wait beyond it is
// refused whole (nothing written), /metrics counts what is under way,
// and another client's requests are answered meanwhile. When the polls
// end, the client may poll again.
func TestInflightBounds(t *testing.T) {
	testenv.SkipShort(t, testenv.Etcd) // seconds of load or of an etcd restarted: not a unit test
	st := hookStore(t, 50, "chat")
	const operator = "0123456789abcdef-operator"
	poller, other := apiauth.NewToken(), apiauth.NewToken()
	sec := credentials(t, operator,
		entry("poller", poller, "  apps: [chat]\n  rate: 10000\n  burst: 10000\n  waits: 4\n")+
			entry("other", other, "  apps: [chat]\n  rate: 1000\n"), nil)
	reg := prometheus.NewRegistry()
	a := &agent{st: st, m: newMetrics(reg)}
	h := &hooks{a: a, keys: sec.keys}
	h.inflight.Changed = func(client string, k apiauth.Kind, n int) {
		a.m.apiInflight.WithLabelValues(client, string(k)).Set(float64(n))
	}
	api := serveHooks(t, h)
	create := func(tok string) string {
		t.Helper()
		code, _, v := api.do("POST", "/v1/deployments", tok, `{"app":"chat"}`)
		if code != 201 {
			t.Fatalf("create: %d %v", code, v)
		}
		return v["id"].(string)
	}
	mine, theirs := create(poller), create(other)

	const polls = 200
	codes := make(chan int, polls)
	var wg sync.WaitGroup
	for range polls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Held until their wait ends, well after the checks below.
			code, _, _ := api.do("GET", "/v1/deployments/"+mine+"?wait=15s&after=2100-01-01T00:00:00Z", poller, "")
			codes <- code
		}()
	}
	// The bound is held, and the rest were refused at once.
	deadline := time.Now().Add(12 * time.Second)
	for len(codes) < polls-4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := h.inflight.InUse("poller", apiauth.KindWait); n != 4 {
		t.Errorf("long polls of poller under way: %d; want its bound, 4", n)
	}
	if got := gaugeValue(t, reg, "fogdeploy_api_inflight", map[string]string{"client": "poller", "kind": "wait"}); got != 4 {
		t.Errorf("fogdeploy_api_inflight{client=poller,kind=wait} = %v; want 4", got)
	}
	before := keys(t, st)
	code, hdr, v := api.do("POST", "/v1/deployments?wait=3s", poller, `{"app":"chat"}`)
	if code != 429 || v["hint"] == nil || !strings.Contains(fmt.Sprint(v["error"]), "4 wait request(s) at once") {
		t.Errorf("a create with ?wait beyond the bound: %d %v %v; want 429 with a hint", code, hdr, v)
	}
	if after := keys(t, st); after != before {
		t.Errorf("the refused create wrote into etcd: %d keys, then %d", before, after)
	}
	// Another client is answered meanwhile, long poll included (its
	// speed is the bench's to measure).
	if code, _, v := api.do("GET", "/v1/deployments/"+theirs+"?wait=1ms", other, ""); code != 200 {
		t.Errorf("another client's read during the polls: %d %v", code, v)
	}
	if n := h.inflight.InUse("poller", apiauth.KindWait); n != 4 {
		t.Errorf("long polls of poller under way after the checks: %d; want still its bound, 4 (a poll ended before its wait?)", n)
	}
	wg.Wait()
	close(codes)
	n := map[int]int{}
	for c := range codes {
		n[c]++
	}
	if n[200] != 4 || n[429] != polls-4 {
		t.Errorf("200 long polls with a bound of 4: %v; want 4 answered at their wait and %d 429s", n, polls-4)
	}
	if n := h.inflight.InUse("poller", apiauth.KindWait); n != 0 {
		t.Errorf("long polls under way once all ended: %d", n)
	}
	if code, _, v := api.do("GET", "/v1/deployments/"+mine+"?wait=1ms", poller, ""); code != 200 {
		t.Errorf("a long poll once the others ended: %d %v", code, v)
	}
}

// gaugeValue is the value of gauge name with labels in reg (-1: none).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// A client's quota of deployments: with deployments: 2, a third create is
// a 429 with a hint that writes nothing; once one is deleted, it may
// create again. Another client's deployments do not count against it.
func TestDeploymentQuota(t *testing.T) {
	st := hookStore(t, 50, "chat")
	const operator = "0123456789abcdef-operator"
	capped, other := apiauth.NewToken(), apiauth.NewToken()
	sec := credentials(t, operator,
		entry("capped", capped, "  apps: [chat]\n  rate: 1000\n  deployments: 2\n")+
			entry("other", other, "  apps: [chat]\n  rate: 1000\n"), nil)
	h := &hooks{a: &agent{st: st}, keys: sec.keys}
	api := serveHooks(t, h)
	create := func(tok string, want int) string {
		t.Helper()
		code, _, v := api.do("POST", "/v1/deployments", tok, `{"app":"chat"}`)
		if code != want {
			t.Fatalf("create: %d %v; want %d", code, v, want)
		}
		id, _ := v["id"].(string)
		return id
	}
	create(other, 201)
	first := create(capped, 201)
	create(capped, 201)
	before := keys(t, st)
	code, _, v := api.do("POST", "/v1/deployments", capped, `{"app":"chat"}`)
	if code != 429 || v["hint"] == nil || !strings.Contains(fmt.Sprint(v["error"]), "holds 2 deployment(s), its quota") {
		t.Errorf("a create beyond the quota: %d %v; want 429 with a hint", code, v)
	}
	if after := keys(t, st); after != before {
		t.Errorf("the refused create wrote into etcd: %d keys, then %d", before, after)
	}
	if code, _, v := api.do("DELETE", "/v1/deployments/"+first, capped, ""); code != 202 {
		t.Fatalf("delete: %d %v", code, v)
	}
	create(capped, 201)
}

//go:build !no_ceph

package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// stateCheck proves that a restore comes from the checkpoint: before writes
// state into the booted app just before its checkpoint, after reads it back
// from a restored instance, through the app's own protocol.
type stateCheck interface {
	before(ctx context.Context, t deploy.Target) error
	after(ctx context.Context, dep deploy.Deployment) error
	String() string
}

// stateChecks are the catalog's checks, by app name.
func stateCheckFor(app spec.App) stateCheck {
	switch app.Name {
	case "redis":
		return &redisCheck{}
	case "nginx":
		return &nginxCheck{port: app.Ports[0].Port}
	case "pyhttp":
		return &fileCheck{app: app}
	case "postgres":
		return &postgresCheck{}
	case "pgindex":
		return &postgresCheck{countAccounts: true}
	case "mariadb":
		return &mariadbCheck{}
	case "tomcat":
		return &sessionCheck{}
	case "codesearch":
		return &builtAtCheck{port: app.Ports[0].Port}
	case "routes", "fleet":
		return &reseedCheck{builtAtCheck: builtAtCheck{port: app.Ports[0].Port}, seen: map[string]string{}}
	}
	return nil
}

func token() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "fog-" + hex.EncodeToString(b)
}

func port(ports map[string]string, p int) (string, error) {
	addr, ok := ports[strconv.Itoa(p)+"/tcp"]
	if !ok {
		return "", fmt.Errorf("no address for port %d/tcp in %v", p, ports)
	}
	return addr, nil
}

type redisCheck struct{ tok string }

func (c *redisCheck) String() string {
	return "SET fogdeploy:bench before the checkpoint, GET returns it from every restore"
}

func (c *redisCheck) before(ctx context.Context, t deploy.Target) error {
	addr, err := port(t.Ports, 6379)
	if err != nil {
		return err
	}
	c.tok = token()
	_, err = testenv.RedisDo(ctx, nil, addr, "SET", "fogdeploy:bench", c.tok)
	return err
}

func (c *redisCheck) after(ctx context.Context, dep deploy.Deployment) error {
	addr, err := port(dep.Ports, 6379)
	if err != nil {
		return err
	}
	got, err := testenv.RedisDo(ctx, nil, addr, "GET", "fogdeploy:bench")
	if err != nil {
		return err
	}
	if got != c.tok {
		return fmt.Errorf("GET fogdeploy:bench = %q, want %q", got, c.tok)
	}
	return nil
}

func httpGet(ctx context.Context, client *http.Client, u string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return string(body), nil
}

// nginxCheck reads nginx's request counter (stub_status), which lives in
// its shared memory: after a restore it goes on from where the checkpoint
// left it, after a boot it starts again at 1.
type nginxCheck struct{ port, requests int }

var stubRequests = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+(\d+)\s*$`)

func (c *nginxCheck) String() string {
	return "nginx's request counter (stub_status, in memory) goes on after every restore from its value at the checkpoint"
}

func (c *nginxCheck) count(ctx context.Context, ports map[string]string) (int, error) {
	addr, err := port(ports, c.port)
	if err != nil {
		return 0, err
	}
	body, err := httpGet(ctx, nil, "http://"+addr+"/nginx_status")
	if err != nil {
		return 0, err
	}
	m := stubRequests.FindStringSubmatch(body)
	if m == nil {
		return 0, fmt.Errorf("no counters in /nginx_status: %q", body)
	}
	return strconv.Atoi(m[3])
}

func (c *nginxCheck) before(ctx context.Context, t deploy.Target) error {
	addr, err := port(t.Ports, c.port)
	if err != nil {
		return err
	}
	for range 50 {
		if _, err := httpGet(ctx, nil, "http://"+addr+"/"); err != nil {
			return err
		}
	}
	c.requests, err = c.count(ctx, t.Ports)
	return err
}

func (c *nginxCheck) after(ctx context.Context, dep deploy.Deployment) error {
	n, err := c.count(ctx, dep.Ports)
	if err != nil {
		return err
	}
	if n <= c.requests {
		return fmt.Errorf("nginx counted %d requests after the restore, want more than the %d it had counted at the checkpoint", n, c.requests)
	}
	return nil
}

// fileCheck writes a file into the served directory of the app's writable
// clone before the checkpoint; every restore serves it.
type fileCheck struct {
	app spec.App
	tok string
}

func (c *fileCheck) dir() string {
	for i, a := range c.app.Command {
		if (a == "--directory" || a == "-d") && i+1 < len(c.app.Command) {
			return c.app.Command[i+1]
		}
	}
	return c.app.WorkDir
}

func (c *fileCheck) String() string {
	return "a file written into the served directory " + c.dir() + " before the checkpoint is served by every restore"
}

func (c *fileCheck) before(_ context.Context, t deploy.Target) error {
	if t.Root == "" {
		return fmt.Errorf("no root for the app's environment")
	}
	c.tok = token()
	return os.WriteFile(filepath.Join(t.Root, c.dir(), "fogdeploy-bench.txt"), []byte(c.tok), 0o644)
}

func (c *fileCheck) after(ctx context.Context, dep deploy.Deployment) error {
	addr, err := port(dep.Ports, c.app.Ports[0].Port)
	if err != nil {
		return err
	}
	got, err := httpGet(ctx, nil, "http://"+addr+"/fogdeploy-bench.txt")
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != c.tok {
		return fmt.Errorf("GET /fogdeploy-bench.txt = %q, want %q", got, c.tok)
	}
	return nil
}

// postgresCheck creates a table with a row before the checkpoint and
// remembers the postmaster's start time (in memory): every restore has the
// row and the same start time; a boot would have neither.
type postgresCheck struct {
	countAccounts bool
	tok           string
	started       time.Time
}

func (c *postgresCheck) String() string {
	s := "a row inserted before the checkpoint is there after every restore, and pg_postmaster_start_time() is unchanged"
	if c.countAccounts {
		s += "; pgbench_accounts has its rows at once"
	}
	return s
}

func (c *postgresCheck) conn(ctx context.Context, ports map[string]string) (*pgx.Conn, error) {
	addr, err := port(ports, 5432)
	if err != nil {
		return nil, err
	}
	return pgx.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=10")
}

func (c *postgresCheck) before(ctx context.Context, t deploy.Target) error {
	db, err := c.conn(ctx, t.Ports)
	if err != nil {
		return err
	}
	defer db.Close(ctx)
	c.tok = token()
	if _, err := db.Exec(ctx, "CREATE TABLE IF NOT EXISTS fogdeploy_bench (t text); INSERT INTO fogdeploy_bench VALUES ('"+c.tok+"')"); err != nil {
		return err
	}
	// The checkpoint must find the row on disk, not only in the WAL buffers.
	if _, err := db.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	return db.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&c.started)
}

func (c *postgresCheck) after(ctx context.Context, dep deploy.Deployment) error {
	db, err := c.conn(ctx, dep.Ports)
	if err != nil {
		return err
	}
	defer db.Close(ctx)
	var n int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM fogdeploy_bench WHERE t = $1", c.tok).Scan(&n); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("the row written before the checkpoint is there %d times, want 1", n)
	}
	var started time.Time
	if err := db.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started); err != nil {
		return err
	}
	if !started.Equal(c.started) {
		return fmt.Errorf("pg_postmaster_start_time() = %s, want %s (the checkpoint's)", started, c.started)
	}
	if c.countAccounts {
		if err := db.QueryRow(ctx, "SELECT count(*) FROM pgbench_accounts").Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("pgbench_accounts is empty after the restore")
		}
	}
	return nil
}

// mariadbCheck sets a global variable (memory only) and writes a row before
// the checkpoint; every restore has both.
type mariadbCheck struct{ tok string }

const mariadbMaxConns = 173

func (c *mariadbCheck) String() string {
	return fmt.Sprintf("SET GLOBAL max_connections=%d (memory only) and a row written before the checkpoint are there after every restore", mariadbMaxConns)
}

func (c *mariadbCheck) db(ports map[string]string) (*sql.DB, error) {
	addr, err := port(ports, 3306)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("mysql", "root@tcp("+addr+")/?timeout=10s&multiStatements=true")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

func (c *mariadbCheck) before(ctx context.Context, t deploy.Target) error {
	db, err := c.db(t.Ports)
	if err != nil {
		return err
	}
	defer db.Close()
	c.tok = token()
	_, err = db.ExecContext(ctx, fmt.Sprintf("SET GLOBAL max_connections=%d; CREATE DATABASE IF NOT EXISTS fogdeploy; "+
		"CREATE TABLE IF NOT EXISTS fogdeploy.bench (t varchar(64)); INSERT INTO fogdeploy.bench VALUES ('%s')", mariadbMaxConns, c.tok))
	return err
}

func (c *mariadbCheck) after(ctx context.Context, dep deploy.Deployment) error {
	db, err := c.db(dep.Ports)
	if err != nil {
		return err
	}
	defer db.Close()
	var maxConns, n int
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.max_connections").Scan(&maxConns); err != nil {
		return err
	}
	if maxConns != mariadbMaxConns {
		return fmt.Errorf("@@GLOBAL.max_connections = %d after the restore, want %d (set before the checkpoint)", maxConns, mariadbMaxConns)
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM fogdeploy.bench WHERE t = ?", c.tok).Scan(&n); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("the row written before the checkpoint is there %d times, want 1", n)
	}
	return nil
}

// sessionCheck stores an attribute in a servlet session (JVM heap) before
// the checkpoint; every restore returns it for the same session cookie.
type sessionCheck struct {
	tok    string
	cookie []*http.Cookie
}

const sessionPath = "/examples/servlets/servlet/SessionExample"

func (c *sessionCheck) String() string {
	return "a servlet session attribute (JVM heap) stored before the checkpoint is returned by every restore for the same JSESSIONID"
}

func (c *sessionCheck) before(ctx context.Context, t deploy.Target) error {
	addr, err := port(t.Ports, 8080)
	if err != nil {
		return err
	}
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 20 * time.Second}
	c.tok = token()
	u := "http://" + addr + sessionPath
	if _, err := httpGet(ctx, client, u+"?dataname=fogdeploy&datavalue="+url.QueryEscape(c.tok)); err != nil {
		return err
	}
	base, _ := url.Parse(u)
	c.cookie = jar.Cookies(base)
	if len(c.cookie) == 0 {
		return fmt.Errorf("GET %s set no session cookie", u)
	}
	return nil
}

func (c *sessionCheck) after(ctx context.Context, dep deploy.Deployment) error {
	addr, err := port(dep.Ports, 8080)
	if err != nil {
		return err
	}
	jar, _ := cookiejar.New(nil)
	u := "http://" + addr + sessionPath
	base, _ := url.Parse(u)
	jar.SetCookies(base, c.cookie)
	body, err := httpGet(ctx, &http.Client{Jar: jar, Timeout: 20 * time.Second}, u)
	if err != nil {
		return err
	}
	if !strings.Contains(body, c.tok) {
		return fmt.Errorf("the session page after the restore does not show %q", c.tok)
	}
	return nil
}

// builtAtCheck: the index of codesearch, routes and fleet lives only in memory and /healthz says
// when it was built; every restore must report the checkpointed boot's.
type builtAtCheck struct {
	port    int
	builtAt string
}

func (c *builtAtCheck) String() string {
	return "the built_at of the index /healthz reports before the checkpoint is the one of every restore"
}

func (c *builtAtCheck) get(ctx context.Context, ports map[string]string) (string, error) {
	addr, err := port(ports, c.port)
	if err != nil {
		return "", err
	}
	body, err := httpGet(ctx, nil, "http://"+addr+"/healthz")
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`"built_at":\s*"?([^",}]+)`).FindStringSubmatch(body)
	if m == nil {
		return "", fmt.Errorf("GET /healthz = %q: no built_at", body)
	}
	return m[1], nil
}

func (c *builtAtCheck) before(ctx context.Context, t deploy.Target) (err error) {
	c.builtAt, err = c.get(ctx, t.Ports)
	return err
}

func (c *builtAtCheck) after(ctx context.Context, dep deploy.Deployment) error {
	got, err := c.get(ctx, dep.Ports)
	if err != nil {
		return err
	}
	if got != c.builtAt {
		return fmt.Errorf("restored index built at %s, want the checkpointed one, built at %s", got, c.builtAt)
	}
	return nil
}

// reseedCheck: routes and fleet keep their index (the checkpointed boot's
// built_at), and their post_restore reseeds each restored instance's token
// generator: no two restores draw the same first token, and each knows
// its identity.
type reseedCheck struct {
	builtAtCheck
	seen map[string]string // first token -> deployment
}

func (c *reseedCheck) String() string {
	return c.builtAtCheck.String() + "; every restore's first /instance token differs (post_restore reseeds it) and names the deployment"
}

func (c *reseedCheck) after(ctx context.Context, dep deploy.Deployment) error {
	if err := c.builtAtCheck.after(ctx, dep); err != nil {
		return err
	}
	addr, err := port(dep.Ports, c.port)
	if err != nil {
		return err
	}
	body, err := httpGet(ctx, nil, "http://"+addr+"/instance")
	if err != nil {
		return err
	}
	var inst struct {
		Identity *struct {
			Instance string `json:"instance"`
		} `json:"identity"`
		Reseeded *string `json:"reseeded_at"`
		Token    string  `json:"token"`
	}
	if err := json.Unmarshal([]byte(body), &inst); err != nil {
		return fmt.Errorf("GET /instance = %q: %w", body, err)
	}
	if inst.Reseeded == nil {
		return fmt.Errorf("GET /instance = %s: not reseeded after the restore (post_restore)", body)
	}
	if inst.Identity == nil || inst.Identity.Instance != dep.ID {
		return fmt.Errorf("GET /instance = %s: want the identity of deployment %s", body, dep.ID)
	}
	if other, ok := c.seen[inst.Token]; ok {
		return fmt.Errorf("the first token of %s, %s, is that of %s: the restores share their random state", dep.ID, inst.Token, other)
	}
	c.seen[inst.Token] = dep.ID
	return nil
}

package apiauth

import (
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// A tokens file's entries are checked one by one, each problem naming its
// entry and field; a good file gives clients that authenticate by token.
func TestParseTokens(t *testing.T) {
	tokA, tokB := NewToken(), NewToken()
	good := "- name: chat\n  sha256: " + Hash(tokA) + "\n  apps: [chat]\n  label: user\n  rate: 2\n" +
		"- name: ops\n  sha256: " + strings.ToUpper(Hash(tokB)) + "\n  admin: true\n"
	cs, err := ParseTokens([]byte(good), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].Name != "chat" || cs[0].Label != "user" || !cs[1].Admin {
		t.Fatalf("parsed %+v", cs)
	}
	if r, b := cs[0].Limits(); r != 2 || b != 4 {
		t.Errorf("limits of rate 2 = %v, %d; want 2 and a burst of 4", r, b)
	}
	if r, _ := cs[1].Limits(); r != 0 {
		t.Errorf("an admin without a rate is limited to %v", r)
	}
	k, err := NewKeyring(cs...)
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]string{tokA: "chat", tokB: "ops"} {
		if c, err := k.Authenticate(tok); err != nil || c.Name != want {
			t.Errorf("Authenticate = %v, %v; want %s", c, err, want)
		}
	}
	for _, bad := range []string{"", "nope", Hash(tokA), tokA + " "} {
		if c, err := k.Authenticate(bad); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Authenticate(%q) = %v, %v; want ErrUnauthorized", bad, c, err)
		}
	}

	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"empty", "", []string{"holds no client"}},
		{"not a list", "name: x\n", []string{"a YAML list of clients"}},
		{"unknown field", "- name: a\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n  scope: all\n", []string{"scope"}},
		{"clear token", "- name: a\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n- name: b\n  sha256: " + tokB + "\n  apps: [a]\n",
			[]string{"entry 2 (b): sha256: give the 64 hex digits", "never the token itself"}},
		{"no apps", "- name: a\n  sha256: " + Hash(tokA) + "\n", []string{"entry 1 (a): apps is empty"}},
		{"bad app", "- name: a\n  sha256: " + Hash(tokA) + "\n  apps: [Chat App]\n", []string{"entry 1 (a): apps[0]"}},
		{"bad name", "- name: Big Client\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n", []string{"entry 1 (Big Client): name"}},
		{"operator", "- name: operator\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n", []string{"name \"operator\" is the operator's"}},
		{"bad label", "- name: a\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n  label: a=b\n", []string{"entry 1 (a): label \"a=b\""}},
		{"bad rate", "- name: a\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n  rate: -1\n  burst: -2\n", []string{"entry 1 (a): rate -1", "burst -2"}},
		{"admin with apps", "- name: a\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n  admin: true\n", []string{"entry 1 (a): admin:"}},
		{"same name", "- name: a\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n- name: a\n  sha256: " + Hash(tokB) + "\n  apps: [a]\n",
			[]string{"entry 2 (a): name: entry 1 has it too"}},
		{"same token", "- name: a\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n- name: b\n  sha256: " + Hash(tokA) + "\n  apps: [a]\n",
			[]string{"entry 2 (b): sha256: entry 1 has the same token"}},
	} {
		_, err := ParseTokens([]byte(tc.file), "t.yaml")
		if err == nil || !errors.Is(err, layering.ErrInvalid) {
			t.Errorf("%s: ParseTokens = %v; want an invalid-argument error", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) || !strings.Contains(err.Error(), "t.yaml") {
				t.Errorf("%s: %v\nwant it to name the file and say %q", tc.name, err, w)
			}
		}
	}
}

// Scopes: apps, and only what the client created, with or without a
// label (another client's deployment of the same app is not its); creates
// carry the label.
func TestScopes(t *testing.T) {
	chat := &Client{Name: "chat", Apps: []string{"chat"}, Label: "user"}
	anyApp := &Client{Name: "any", Apps: []string{AllApps}}
	admin := &Client{Name: "root", Admin: true}
	for _, tc := range []struct {
		c            *Client
		app, creator string
		want         bool
	}{
		{chat, "chat", "chat", true},
		{chat, "chat", "other", false},
		{chat, "chat", "", false},
		{chat, "db", "chat", false},
		{anyApp, "db", "any", true},
		{anyApp, "db", "someone", false},
		{anyApp, "db", "", false},
		{admin, "db", "", true},
	} {
		if got := tc.c.Sees(tc.app, tc.creator); got != tc.want {
			t.Errorf("%s.Sees(%s of %q) = %v; want %v", tc.c.Name, tc.app, tc.creator, got, tc.want)
		}
	}
	if err := chat.MayCreate("chat", map[string]string{"user": "alice"}); err != nil {
		t.Error(err)
	}
	if err := chat.MayCreate("chat", nil); !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), "labels.user") {
		t.Errorf("create without the label = %v", err)
	}
	if err := chat.MayCreate("db", map[string]string{"user": "alice"}); !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), "app db") {
		t.Errorf("create of another app = %v", err)
	}
	if chat.MayReadMetrics() || !admin.MayReadMetrics() || !(&Client{Metrics: true}).MayReadMetrics() {
		t.Error("MayReadMetrics: only admins and metrics: true")
	}
}

// A client gets its burst at once, then its rate; a refusal says when
// to retry and takes nothing.
func TestAllow(t *testing.T) {
	k, err := NewKeyring(Client{Name: "a", Apps: []string{"x"}, Rate: 0.5, Burst: 2, sum: [32]byte{1}}, Client{Name: "b", Admin: true, sum: [32]byte{2}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := k.clients[0], k.clients[1]
	now := time.Unix(1000, 0)
	for i := range 2 {
		if _, ok := a.Allow(now); !ok {
			t.Fatalf("request %d of a burst of 2 refused", i+1)
		}
	}
	for range 3 {
		if wait, ok := a.Allow(now); ok || wait != 2*time.Second {
			t.Fatalf("beyond the burst: %v, %v; want a refusal, retry in 2 s", wait, ok)
		}
	}
	if _, ok := a.Allow(now.Add(2 * time.Second)); !ok {
		t.Error("refused after the retry time")
	}
	for range 1000 {
		if _, ok := b.Allow(now); !ok {
			t.Fatal("an admin without a rate was limited")
		}
	}
}

// Files: the operator's token is read, hashed and too open a file refused;
// the tokens file likewise; Mint makes entries the parser accepts.
func TestFiles(t *testing.T) {
	dir := t.TempDir()
	op := filepath.Join(dir, "token")
	os.WriteFile(op, []byte("  0123456789abcdef-operator\n"), 0o600)
	c, err := ReadOperatorToken(op)
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != OperatorName || !c.Admin || c.sum != [32]byte(mustHex(t, Hash("0123456789abcdef-operator"))) {
		t.Errorf("operator client = %+v", c)
	}
	os.Chmod(op, 0o640)
	if _, err := ReadOperatorToken(op); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("token file mode 0640 = %v", err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	if _, err := ReadOperatorToken(short); err == nil || !strings.Contains(err.Error(), "shorter than 16") {
		t.Errorf("short token = %v", err)
	}

	token, entry, err := Mint(Client{Name: "chat", Apps: []string{"chat"}, Label: "user", Rate: 5, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(token, TokenPrefix) || len(token) < 40 || strings.Contains(string(entry), token) {
		t.Fatalf("minted %q with entry\n%s", token, entry)
	}
	tf := filepath.Join(dir, "tokens.yaml")
	os.WriteFile(tf, entry, 0o600)
	cs, err := LoadTokens(tf)
	if err != nil || len(cs) != 1 || cs[0].SHA256 != Hash(token) || cs[0].Rate != 5 || cs[0].Burst != 10 || cs[0].Label != "user" {
		t.Fatalf("LoadTokens of a minted entry = %+v, %v\n%s", cs, err, entry)
	}
	os.Chmod(tf, 0o666)
	if _, err := LoadTokens(tf); err == nil || !strings.Contains(err.Error(), "agent.tokens_file") || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("tokens file mode 0666 = %v", err)
	}
	if _, _, err := Mint(Client{Name: "x"}); err == nil || !strings.Contains(err.Error(), "apps is empty") {
		t.Errorf("Mint without apps = %v", err)
	}
	if _, err := ClientTLS(tf); err == nil || !strings.Contains(err.Error(), "agent.ca_file") {
		t.Errorf("ClientTLS of a file without certificates = %v", err)
	}
	if cfg, err := ClientTLS(""); err != nil || cfg.RootCAs != nil {
		t.Errorf("ClientTLS without a CA file = %v, %v; want the system's roots", cfg, err)
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A client's bounds: its token's, else the defaults; an admin has none
// unless its entry gives one. A request beyond is refused with
// ErrTooMany and a hint, counting nothing; a release frees its place once.
func TestInflight(t *testing.T) {
	c := &Client{Name: "chat", Apps: []string{"chat"}, Waits: 2}
	if c.Bound(KindWait) != 2 || c.Bound(KindMigration) != DefaultMigrations {
		t.Errorf("bounds of %+v: %d waits, %d migrations", c, c.Bound(KindWait), c.Bound(KindMigration))
	}
	if admin := (&Client{Name: "ops", Admin: true}); admin.Bound(KindWait) != 0 || admin.Bound(KindMigration) != 0 {
		t.Errorf("an admin's bounds: %d, %d; want none", admin.Bound(KindWait), admin.Bound(KindMigration))
	}
	var f Inflight
	var changes []int
	f.Changed = func(client string, k Kind, n int) { changes = append(changes, n) }
	r1, err1 := f.Take(c, KindWait)
	r2, err2 := f.Take(c, KindWait)
	if err1 != nil || err2 != nil {
		t.Fatalf("two waits within the bound: %v, %v", err1, err2)
	}
	if _, err := f.Take(c, KindWait); !errors.Is(err, ErrTooMany) || !strings.Contains(hint.Of(err), "waits") {
		t.Errorf("a third wait: %v; want ErrTooMany with a hint naming waits", err)
	}
	if _, err := f.Take(c, KindMigration); err != nil {
		t.Errorf("a migration beside the waits: %v", err)
	}
	r1()
	r1() // once only
	if f.InUse("chat", KindWait) != 1 {
		t.Errorf("waits in use after one release (called twice): %d; want 1", f.InUse("chat", KindWait))
	}
	r2()
	if !slices.Equal(changes, []int{1, 2, 1, 1, 0}) {
		t.Errorf("counts reported: %v", changes)
	}
	if _, err := ParseTokens([]byte("- name: x\n  sha256: "+Hash(NewToken())+"\n  apps: [a]\n  waits: -1\n  migrations: 100001\n"), "t.yaml"); err == nil ||
		!strings.Contains(err.Error(), "waits -1") || !strings.Contains(err.Error(), "migrations 100001") {
		t.Errorf("bad bounds in a tokens file: %v; want both named", err)
	}
}

// Package apiauth holds the credentials of a pop-agent's HTTP API: the
// clients of its tokens file (agent.tokens_file), each with the SHA-256 of
// its bearer token, the apps it may deploy, the label that makes its
// deployments its own, and its rate; the operator's admin token
// (agent.token_file); the TLS configurations of the agent and of the
// callers that verify it (fogctl).
//
// No clear token is kept: a token is hashed as soon as it is read, and
// compared with every client's hash in constant time.
package apiauth

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
	"golang.org/x/time/rate"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Errors of the API's callers.
var (
	// ErrUnauthorized: no bearer token, or one no client has (401).
	ErrUnauthorized = errors.New("missing or unknown bearer token")
	// ErrForbidden: a known token asked for what is outside its scope (403).
	ErrForbidden = errors.New("outside the token's scope")
)

// OperatorName is the client of agent.token_file: the operator's admin
// token. No entry of a tokens file may take it.
const OperatorName = "operator"

// AllApps in a client's apps lets it deploy every app.
const AllApps = "*"

// Rates of a client that gives none (requests per second, and the burst
// above it); an admin without a rate has no limit.
const (
	DefaultRate  = 10
	DefaultBurst = 20
	maxRate      = 100000
)

// MaxTokensFileSize bounds a tokens file.
const MaxTokensFileSize = 1 << 20

// MinTokenLen is the shortest token accepted (agent.token_file).
const MinTokenLen = 16

// Client is one caller of the API: an entry of the tokens file.
type Client struct {
	// Name identifies the client in logs and on the deployments it creates.
	Name string `yaml:"name"`
	// SHA256 is the hex SHA-256 of its token (never the token).
	SHA256 string `yaml:"sha256"`
	// Apps it may deploy, list, read and delete; ["*"]: every app.
	Apps []string `yaml:"apps,omitempty"`
	// Label, when set, is a label key (e.g. "user"): the client may only
	// create deployments that carry it. With or without it, a client's
	// deployments are the ones it created (Sees); only an admin sees
	// another client's.
	Label string `yaml:"label,omitempty"`
	// Rate is its requests per second (default 10; an admin: no limit),
	// Burst how many it may send at once above it (default 2 x rate).
	Rate  float64 `yaml:"rate,omitempty"`
	Burst int     `yaml:"burst,omitempty"`
	// Waits is how many long polls (?wait) it may have under way at once
	// (default 16; an admin: no bound unless given); Migrations how many
	// migrations (default 2). Beyond, a request is a 429.
	Waits      int `yaml:"waits,omitempty"`
	Migrations int `yaml:"migrations,omitempty"`
	// Deployments is how many deployments it may hold at once (default
	// 64; an admin: no bound unless given). Beyond, a create is a 429.
	Deployments int `yaml:"deployments,omitempty"`
	// Admin has every app and sees every deployment, and /metrics.
	Admin bool `yaml:"admin,omitempty"`
	// Metrics may read /metrics, which names the node's apps.
	Metrics bool `yaml:"metrics,omitempty"`

	sum [sha256.Size]byte
	lim *rate.Limiter // nil: no limit
}

// Hash is the hex SHA-256 of a token, as a tokens file holds it.
func Hash(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// check validates one entry, naming each field it refuses, and decodes
// its hash.
func (c *Client) check() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if err := layering.ValidateName("name", c.Name); err != nil {
		errs = append(errs, err)
	} else if c.Name == OperatorName {
		add("name %q is the operator's (agent.token_file): give the client another name", c.Name)
	}
	c.SHA256 = strings.ToLower(strings.TrimSpace(c.SHA256))
	if b, err := hex.DecodeString(c.SHA256); err != nil || len(b) != sha256.Size {
		add("sha256: give the 64 hex digits of the SHA-256 of the client's token, never the token itself (`pop-agent token` prints both)")
	} else {
		copy(c.sum[:], b)
	}
	if c.Admin {
		if len(c.Apps) > 0 || c.Label != "" {
			add("admin: an admin has every app and sees every deployment: drop apps and label, or admin")
		}
	} else if len(c.Apps) == 0 {
		add("apps is empty: list the apps the client may deploy, or [\"*\"] for every app")
	}
	for i, a := range c.Apps {
		if a == AllApps {
			continue
		}
		if err := layering.ValidateName(fmt.Sprintf("apps[%d]", i), a); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Label != "" {
		if err := CheckLabelKey(c.Label); err != nil {
			add("label %q: %v", c.Label, err)
		}
	}
	if c.Rate < 0 || c.Rate > maxRate || math.IsNaN(c.Rate) {
		add("rate %v: give requests per second, above 0 and at most %d (default %d)", c.Rate, maxRate, DefaultRate)
	}
	if c.Waits < 0 || c.Waits > maxInflight {
		add("waits %d: give how many long polls (?wait) the client may have under way at once, 1 to %d (default %d)", c.Waits, maxInflight, DefaultWaits)
	}
	if c.Deployments < 0 || c.Deployments > maxInflight {
		add("deployments %d: give how many deployments the client may hold at once, 1 to %d (default %d)", c.Deployments, maxInflight, DefaultDeployments)
	}
	if c.Migrations < 0 || c.Migrations > maxInflight {
		add("migrations %d: give how many migrations the client may have under way at once, 1 to %d (default %d)", c.Migrations, maxInflight, DefaultMigrations)
	}
	if c.Burst < 0 || c.Burst > maxRate {
		add("burst %d: give how many requests may come at once above the rate, 1 to %d (default twice the rate)", c.Burst, maxRate)
	}
	if c.Burst > 0 && c.Rate == 0 && c.Admin {
		add("burst %d without a rate: give the admin's rate too, or neither (no limit)", c.Burst)
	}
	return errors.Join(errs...)
}

// CheckLabelKey checks a label key as the hook API does: 1-63 characters,
// no spaces or '='.
func CheckLabelKey(k string) error {
	if k == "" || len(k) > 63 || strings.ContainsAny(k, " \t\n=") {
		return errors.New("label keys are 1-63 characters without spaces or '='")
	}
	return nil
}

// Limits returns the client's rate and burst, its defaults applied; a
// zero rate is no limit.
func (c *Client) Limits() (float64, int) {
	r, b := c.Rate, c.Burst
	if r == 0 {
		if c.Admin {
			return 0, 0
		}
		r = DefaultRate
		if b == 0 {
			b = DefaultBurst
		}
	}
	if b == 0 {
		b = int(math.Ceil(2 * r))
	}
	return r, b
}

// ParseTokens reads the entries of a tokens file (a YAML list of clients)
// from data; source names it in errors. Every problem is reported at
// once, each naming its entry and field.
func ParseTokens(data []byte, source string) ([]Client, error) {
	if len(data) > MaxTokensFileSize {
		return nil, fmt.Errorf("tokens file %s is larger than %d bytes: %w", source, MaxTokensFileSize, layering.ErrInvalid)
	}
	var clients []Client
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&clients); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("tokens file %s: %w: a YAML list of clients {name, sha256, apps, label?, rate?, burst?, admin?, metrics?} (docs/api.md): %w",
			source, err, layering.ErrInvalid)
	}
	if len(clients) == 0 {
		return nil, fmt.Errorf("tokens file %s holds no client: add one with `pop-agent token --name NAME --apps APP --append %s`: %w", source, source, layering.ErrInvalid)
	}
	var errs []error
	names, sums := map[string]int{}, map[string]int{}
	for i := range clients {
		c := &clients[i]
		entry := fmt.Sprintf("tokens file %s: entry %d (%s)", source, i+1, c.Name)
		if err := c.check(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", entry, err))
		}
		if j, ok := names[c.Name]; ok && c.Name != "" {
			errs = append(errs, fmt.Errorf("%s: name: entry %d has it too: give each client its own name", entry, j))
		}
		if j, ok := sums[c.SHA256]; ok && c.SHA256 != "" {
			errs = append(errs, fmt.Errorf("%s: sha256: entry %d has the same token: mint one token per client (`pop-agent token`)", entry, j))
		}
		names[c.Name], sums[c.SHA256] = i+1, i+1
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", err, layering.ErrInvalid)
	}
	return clients, nil
}

// LoadTokens reads the tokens file at path (agent.tokens_file). Others
// than its owner may not write it.
func LoadTokens(path string) ([]Client, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("agent.tokens_file: %w", err)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("agent.tokens_file %s is writable by others (mode %o): chmod 600 it: %w", path, fi.Mode().Perm(), layering.ErrInvalid)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("agent.tokens_file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxTokensFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("agent.tokens_file %s: %w", path, err)
	}
	return ParseTokens(data, path)
}

// ReadOperatorToken reads the operator's admin token (agent.token_file:
// the token in clear, mode 0600 or stricter, at least 16 characters) and
// returns its client: an admin named "operator" that keeps only its hash.
func ReadOperatorToken(path string) (Client, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Client{}, fmt.Errorf("agent.token_file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return Client{}, fmt.Errorf("agent.token_file %s is readable by others (mode %o): chmod 600 it: %w", path, fi.Mode().Perm(), layering.ErrInvalid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Client{}, fmt.Errorf("agent.token_file: %w", err)
	}
	defer clear(b)
	t := bytes.TrimSpace(b)
	if len(t) < MinTokenLen {
		return Client{}, fmt.Errorf("agent.token_file %s: the token is shorter than %d characters: %w", path, MinTokenLen, layering.ErrInvalid)
	}
	return Client{Name: OperatorName, Admin: true, sum: sha256.Sum256(t)}, nil
}

// The credentials of the agent's API: its TLS certificate and the clients
// of its token files.

package agent

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/config"
)

// apiSecurity is how the agent's API admits callers.
type apiSecurity struct {
	// keys are the clients: the operator's (agent.token_file) and the
	// tokens file's; nil only with --dev and neither file.
	keys *apiauth.Keyring
	// tls serves the API over TLS; nil: plain HTTP, on a loopback
	// address only.
	tls *tls.Config
}

// loadAPISecurity reads the token files and the certificate: a file that
// is missing, too open or malformed, an entry of the tokens file with a
// bad field, or a plain listener on a non-loopback address is an error
// that names it.
func loadAPISecurity(c config.Config, o Options, now time.Time, log *slog.Logger) (apiSecurity, error) {
	var sec apiSecurity
	if err := c.Agent.CheckServe(o.Listen, o.Dev); err != nil {
		return sec, err
	}
	var clients []apiauth.Client
	if c.Agent.TokenFile != "" {
		op, err := apiauth.ReadOperatorToken(c.Agent.TokenFile)
		if err != nil {
			return sec, err
		}
		clients = append(clients, op)
	}
	if c.Agent.TokensFile != "" {
		cs, err := apiauth.LoadTokens(c.Agent.TokensFile)
		if err != nil {
			return sec, err
		}
		clients = append(clients, cs...)
	}
	if len(clients) > 0 {
		keys, err := apiauth.NewKeyring(clients...)
		if err != nil {
			return sec, fmt.Errorf("agent.token_file and agent.tokens_file: %w", err)
		}
		sec.keys = keys
	}
	if c.Agent.TLS() {
		cfg, err := apiauth.ServerTLS(c.Agent.TLSCertFile, c.Agent.TLSKeyFile, now)
		if err != nil {
			return sec, err
		}
		sec.tls = cfg
	}
	switch {
	case sec.tls == nil && !o.Dev:
		log.Warn("the API is served as plain HTTP on a loopback address: give agent.tls_cert_file and agent.tls_key_file to serve it over TLS", "listen", o.Listen)
	case sec.keys == nil:
		log.Warn("--dev without a token: every caller of the API is an admin", "listen", o.Listen)
	}
	var names []string
	if sec.keys != nil {
		names = sec.keys.Names()
	}
	log.Info("API credentials", "tls", sec.tls != nil, "clients", names)
	return sec, nil
}

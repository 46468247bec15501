package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/config"
	hintpkg "github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// agentAPI calls the API of one node's agent.
type agentAPI struct {
	base   *url.URL // scheme and host of the agent, as its node registered them
	client *http.Client
	token  string // of agent.token_file (FOGDEPLOY_TOKEN_FILE); "" without one
}

// newAgentAPI makes the caller of the agent of node, registered at api
// (https://host:port over TLS, host:port for plain HTTP): over TLS it
// verifies the agent's certificate against agent.ca_file (--agent-ca-file,
// FOGDEPLOY_CA_FILE), else the system's roots. A token is never sent in
// clear beyond a loopback address.
func newAgentAPI(c config.Config, node, api string) (*agentAPI, error) {
	raw := api
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("node %s registered the API address %q: %w: want host:port or https://host:port", node, api, layering.ErrInvalid)
	}
	a := &agentAPI{base: &url.URL{Scheme: u.Scheme, Host: u.Host}, client: http.DefaultClient}
	if c.Agent.TokenFile != "" {
		// As before: a token file fogctl cannot read sends no token (the
		// agent answers 401 if it wants one).
		if b, err := os.ReadFile(c.Agent.TokenFile); err == nil {
			a.token = strings.TrimSpace(string(b))
			clear(b)
		}
	}
	if u.Scheme == "https" {
		cfg, err := apiauth.ClientTLS(c.Agent.CAFile)
		if err != nil {
			return nil, err
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg
		a.client = &http.Client{Transport: tr}
	} else if a.token != "" && !config.Loopback(u.Host) {
		return nil, hintpkg.With(fmt.Errorf("agent of %s serves plain HTTP at %s, beyond this machine: %w: fogctl sends no token in clear",
			node, api, layering.ErrInvalid), "give that pop-agent agent.tls_cert_file and agent.tls_key_file, and restart it")
	}
	return a, nil
}

// get sends GET path (with its query) to the agent.
func (a *agentAPI) get(ctx context.Context, node, path string) (*http.Response, error) {
	u := *a.base
	p, q, _ := strings.Cut(path, "?")
	u.Path, u.RawQuery = p, q
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.client.Do(req)
	if err == nil {
		return resp, nil
	}
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	var host x509.HostnameError
	switch {
	case errors.As(err, &unknown), errors.As(err, &verify), errors.As(err, &host):
		return nil, hintpkg.With(fmt.Errorf("agent of %s at %s: its certificate does not verify: %w: %w", node, a.base.Host, layering.ErrInvalid, err),
			"give the CA that signed the agents' certificates: --agent-ca-file or FOGDEPLOY_CA_FILE (agent.ca_file); the certificate must name the address the agent registers")
	}
	return nil, fmt.Errorf("agent of %s at %s: %w: %w", node, a.base.Host, layering.ErrUnavailable, err)
}

package apiauth

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// TokenPrefix starts every minted token, so that secret scanners find them.
const TokenPrefix = "fdp_"

// NewToken returns a random token: 32 bytes from crypto/rand (which
// never fails; it aborts the program rather than return weak bytes).
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// Mint returns a new token for c and c's entry of a tokens file (with the
// token's hash). c is checked as the agent checks it.
func Mint(c Client) (token string, entry []byte, err error) {
	token = NewToken()
	c.SHA256 = Hash(token)
	if err := c.check(); err != nil {
		return "", nil, err
	}
	entry, err = yaml.Marshal([]Client{c})
	if err != nil {
		return "", nil, fmt.Errorf("encoding the entry: %w", err)
	}
	return token, entry, nil
}

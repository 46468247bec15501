package testenv

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// HTTPGet returns the trimmed body of GET url, failing t on a transport
// error.
func HTTPGet(ctx context.Context, t testing.TB, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

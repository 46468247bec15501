// An image's metadata and tag, kept in memory.

package fakestore

import (
	"bytes"
	"context"
	"fmt"
	"maps"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Meta implements layering.Store.
func (s *Store) Meta(ctx context.Context, name string) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.get(name)
	if err != nil {
		return nil, err
	}
	return maps.Clone(img.meta), nil
}

// SetMeta implements layering.Store.
func (s *Store) SetMeta(ctx context.Context, name string, meta map[string]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.get(name)
	if err != nil {
		return err
	}
	for key, value := range meta {
		if value == "" {
			delete(img.meta, key)
		} else {
			img.meta[key] = value
		}
	}
	return nil
}

// Tag implements layering.Catalog.
func (s *Store) Tag(ctx context.Context, name string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.tags[name]
	if !ok {
		return nil, fmt.Errorf("environment %q: %w", name, layering.ErrNotFound)
	}
	return bytes.Clone(rec), nil
}

// SetTag implements layering.Catalog.
func (s *Store) SetTag(ctx context.Context, name string, record []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tags[name] = bytes.Clone(record)
	return nil
}

// SwapTag implements layering.Catalog.
func (s *Store) SwapTag(ctx context.Context, name string, prev, record []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := layering.CheckSwap(name, s.tags[name], prev); err != nil {
		return err
	}
	s.tags[name] = bytes.Clone(record)
	return nil
}

// Tags implements layering.Catalog.
func (s *Store) Tags(ctx context.Context) (map[string][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]byte, len(s.tags))
	for k, v := range s.tags {
		out[k] = bytes.Clone(v)
	}
	return out, nil
}

// DeleteTag implements layering.Catalog.
func (s *Store) DeleteTag(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tags, name)
	return nil
}

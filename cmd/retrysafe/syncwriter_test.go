package main

import (
	"io"
	"sync"
)

// syncWriter serialises writes from the server's goroutines into a buffer the test reads.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

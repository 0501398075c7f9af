// Package httpserve builds the http.Server of every listener a binary opens
// (ingest-api's API and metrics listeners, the worker's metrics/health
// listener), so that each is bounded the same way.
package httpserve

import (
	"log"
	"net/http"
	"time"
)

// Timeouts bound each connection of a listener. A metrics or health
// listener needs them as much as an API: without them a client that sends
// its headers, or reads the answer, a byte at a time (slow loris) holds a
// connection and a goroutine for as long as it likes.
type Timeouts struct {
	ReadHeader, Read, Write, Idle time.Duration
}

// DefaultTimeouts leave Write room for a /readyz probe (a store timeout of
// 5 to 10 s) and Idle for a scraper's keep-alive between scrapes.
var DefaultTimeouts = Timeouts{ReadHeader: 10 * time.Second, Read: 30 * time.Second, Write: 30 * time.Second, Idle: 120 * time.Second}

// MaxHeaderBytes bounds a request's headers: no route of the contract needs
// more than a bearer token and a few short headers.
const MaxHeaderBytes = 64 << 10

// Server is an http.Server for h under t; errLog receives the server's own
// errors (nil: the standard logger).
func (t Timeouts) Server(h http.Handler, errLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          errLog,
	}
}

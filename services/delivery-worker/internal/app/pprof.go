package app

import (
	"net/http"
	"net/http/pprof"
)

// mountPprof serves the runtime profiles under /debug/pprof/ (PPROF_ENABLED).
// They are mounted by hand rather than by importing net/http/pprof for its
// side effect, which registers them on http.DefaultServeMux for any server
// that uses it. A CPU profile must end within the listener's write timeout
// (30s).
func mountPprof(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

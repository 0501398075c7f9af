package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func TestEndpointValidateURL(t *testing.T) {
	ok := []string{
		"https://hooks.example.com/a?b=c",
		"https://hooks.example.com:8443/",
		"HTTPS://hooks.example.com",
		"https://10.0.0.1/", // address checks are the worker's, at each attempt
		"http://127.0.0.1:8080/hook",
		"http://127.9.9.9/",
		"http://localhost:9000/x",
		"http://LOCALHOST/",
		"http://[::1]:8080/",
		"https://" + strings.Repeat("a", store.MaxEndpointURL-len("https://")),
	}
	for _, u := range ok {
		if err := store.ValidateEndpointURL(u); err != nil {
			t.Errorf("ValidateEndpointURL(%q) = %v, want nil", u, err)
		}
	}
	bad := map[string]string{
		"empty":                "",
		"too long":             "https://" + strings.Repeat("a", store.MaxEndpointURL),
		"http public":          "http://hooks.example.com/",
		"http private":         "http://10.0.0.1/",
		"http mapped loopback": "http://[::ffff:127.0.0.1]/",
		"http localhost.":      "http://localhost./",
		"ftp":                  "ftp://hooks.example.com/",
		"no scheme":            "hooks.example.com/x",
		"relative":             "/hook",
		"opaque":               "https:hooks.example.com",
		"no host":              "https:///path",
		"user info":            "https://user:secret-token@hooks.example.com/",
		"user only":            "https://user@hooks.example.com/",
		"fragment":             "https://hooks.example.com/#frag",
		"empty fragment":       "https://hooks.example.com/#",
		"space":                "https://hooks.example.com/a b",
		"control":              "https://hooks.example.com/\n",
		"non-ASCII":            "https://hööks.example.com/",
		"port 0":               "https://hooks.example.com:0/",
		"port too big":         "https://hooks.example.com:65536/",
		"empty port":           "https://hooks.example.com:/",
		"no host with port":    "https://:443/",
	}
	for name, u := range bad {
		err := store.ValidateEndpointURL(u)
		if !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: ValidateEndpointURL = %v, want ErrInvalid", name, err)
			continue
		}
		if strings.Contains(err.Error(), "secret-token") || (u != "" && strings.Contains(err.Error(), u)) {
			t.Errorf("%s: error %q repeats the URL", name, err)
		}
	}
}

func TestEndpointAddGetSetState(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	e := store.Endpoint{TenantID: "t1", ProjectID: "p1", Topic: "task.proposals",
		URL: "https://hooks.example.com/in", SecretRef: "prod/hooks-1"}
	id, err := f.s.Outbox().AddEndpoint(ctx, e)
	if err != nil || !strings.HasPrefix(id, "ep_") {
		t.Fatalf("AddEndpoint: %q, %v", id, err)
	}
	got, err := f.s.Outbox().GetEndpoint(ctx, "t1", id)
	if err != nil || got.ID != id || got.TenantID != "t1" || got.ProjectID != "p1" || got.Topic != e.Topic ||
		got.URL != e.URL || got.SecretRef != e.SecretRef || got.State != store.EndpointActive ||
		got.DisabledReason != "" || got.CreatedAt.IsZero() {
		t.Fatalf("GetEndpoint: %+v, %v", got, err)
	}

	if err := f.s.Outbox().SetEndpointState(ctx, "t1", id, store.EndpointDisabled, "operator"); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", id, store.EndpointDisabled, "operator"); err != nil {
		t.Fatalf("disabling twice: %v", err)
	}
	if got, _ := f.s.Outbox().GetEndpoint(ctx, "t1", id); got.State != store.EndpointDisabled || got.DisabledReason != "operator" {
		t.Fatalf("disabled endpoint %+v", got)
	}
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", id, store.EndpointActive, "ignored"); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.s.Outbox().GetEndpoint(ctx, "t1", id); got.State != store.EndpointActive || got.DisabledReason != "" {
		t.Fatalf("enabled endpoint %+v", got)
	}

	chosen := e
	chosen.ID = "ep_0123456789abcdef01234567"
	chosen.State = store.EndpointDisabled
	chosen.DisabledReason = "operator"
	if id, err := f.s.Outbox().AddEndpoint(ctx, chosen); err != nil || id != chosen.ID {
		t.Fatalf("AddEndpoint with id: %q, %v", id, err)
	}
	if got, _ := f.s.Outbox().GetEndpoint(ctx, "t1", chosen.ID); got.State != store.EndpointDisabled {
		t.Fatalf("added disabled, reads %+v", got)
	}
	_, err = f.s.Outbox().AddEndpoint(ctx, chosen)
	wantErr(t, "id taken", err, store.ErrConflict)
	chosen.TenantID, chosen.SecretRef = "t2", "prod/hooks-2" // a secret ref belongs to one tenant
	if _, err := f.s.Outbox().AddEndpoint(ctx, chosen); err != nil {
		t.Fatalf("same id in another tenant: %v", err)
	}

	invalid := map[string]func(*store.Endpoint){
		"tenant":     func(e *store.Endpoint) { e.TenantID = "" },
		"project":    func(e *store.Endpoint) { e.ProjectID = "p/1" },
		"topic":      func(e *store.Endpoint) { e.Topic = "" },
		"secret ref": func(e *store.Endpoint) { e.SecretRef = "has space" },
		"state":      func(e *store.Endpoint) { e.State = "paused" },
		"id":         func(e *store.Endpoint) { e.ID = "ep_1" },
		"reason":     func(e *store.Endpoint) { e.State, e.DisabledReason = store.EndpointDisabled, "Free Text" },
		"url":        func(e *store.Endpoint) { e.URL = "http://hooks.example.com/" },
	}
	for name, mutate := range invalid {
		bad := e
		mutate(&bad)
		_, err := f.s.Outbox().AddEndpoint(ctx, bad)
		wantErr(t, "add with bad "+name, err, store.ErrInvalid)
	}
	wantErr(t, "bad state", f.s.Outbox().SetEndpointState(ctx, "t1", id, "paused", ""), store.ErrInvalid)
	wantErr(t, "bad reason", f.s.Outbox().SetEndpointState(ctx, "t1", id, store.EndpointDisabled, "x y"), store.ErrInvalid)
	wantErr(t, "unknown id", f.s.Outbox().SetEndpointState(ctx, "t1", "ep_ffffffffffffffffffffffff", store.EndpointActive, ""), store.ErrNotFound)
	wantErr(t, "malformed id", f.s.Outbox().SetEndpointState(ctx, "t1", "nope", store.EndpointActive, ""), store.ErrNotFound)
	_, err = f.s.Outbox().GetEndpoint(ctx, "t1", "ep_ffffffffffffffffffffffff")
	wantErr(t, "get unknown", err, store.ErrNotFound)
	if n := f.count(`SELECT count(*) FROM endpoints`); n != 3 {
		t.Fatalf("%d endpoint rows, want 3", n)
	}
}

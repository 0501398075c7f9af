package loadgen

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
)

// Producer is one simulated device: its credential and signing key. An
// outbox producer is a service credential and has no key (ingest-api signs).
type Producer struct {
	Device string `json:"device"`
	KeyID  string `json:"key_id,omitempty"`
	Token  string `json:"token"`
	Seed   string `json:"seed,omitempty"`
}

// Creds is the credentials file Setup writes and Run reads. Outbox files
// (Setup with Outbox) name the project and topic whose endpoint Setup added.
type Creds struct {
	Tenant    string     `json:"tenant"`
	Account   string     `json:"account"`
	Outbox    bool       `json:"outbox,omitempty"`
	Project   string     `json:"project,omitempty"`
	Topic     string     `json:"topic,omitempty"`
	Producers []Producer `json:"producers"`
}

// MaxProducers bounds setup and run; far beyond any loopback measurement's useful concurrency.
const MaxProducers = 4096

// SetupConfig names what Setup creates: producers <prefix>-0001 … with key ids equal to the device ids.
// With Outbox, service credentials instead, and one active endpoint of (Project, Topic) for their
// enqueues to fan out to (its URL is never called unless a delivery-worker runs).
type SetupConfig struct {
	Tenant, Account, Prefix string
	Producers               int
	Outbox                  bool
	Project, Topic          string
}

// outboxEndpointURL is where the outbox setup's endpoint points: loopback's discard port.
const outboxEndpointURL = "http://127.0.0.1:9/loadgen"

// Setup issues a device credential and registers a fresh key for each producer.
func Setup(ctx context.Context, s *store.Store, cfg SetupConfig) (Creds, error) {
	if cfg.Producers < 1 || cfg.Producers > MaxProducers {
		return Creds{}, fmt.Errorf("producers must be 1-%d", MaxProducers)
	}
	c := Creds{Tenant: cfg.Tenant, Account: cfg.Account}
	if cfg.Outbox {
		return setupOutbox(ctx, s, cfg, c)
	}
	for i := 1; i <= cfg.Producers; i++ {
		device := fmt.Sprintf("%s-%04d", cfg.Prefix, i)
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return Creds{}, fmt.Errorf("generate key: %w", err)
		}
		if err := s.Credentials().AddKey(ctx, cfg.Tenant, device, pub); err != nil {
			if errors.Is(err, store.ErrConflict) {
				return Creds{}, fmt.Errorf("key id %s already exists in tenant %s: use another --prefix: %w", device, cfg.Tenant, err)
			}
			return Creds{}, fmt.Errorf("add key %s: %w", device, err)
		}
		token, _, err := s.Credentials().IssueCredential(ctx, cfg.Tenant, cfg.Account, device, "device")
		if err != nil {
			return Creds{}, fmt.Errorf("issue credential for %s: %w", device, err)
		}
		c.Producers = append(c.Producers, Producer{
			Device: device, KeyID: device, Token: token, Seed: access.EncodeBase64URL(priv.Seed()),
		})
	}
	return c, nil
}

func setupOutbox(ctx context.Context, s *store.Store, cfg SetupConfig, c Creds) (Creds, error) {
	c.Outbox, c.Project, c.Topic = true, cfg.Project, cfg.Topic
	if _, err := s.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: cfg.Tenant, ProjectID: cfg.Project, Topic: cfg.Topic,
		URL: outboxEndpointURL, SecretRef: cfg.Prefix + "-secret"}); err != nil {
		return Creds{}, fmt.Errorf("add endpoint: %w", err)
	}
	for i := 1; i <= cfg.Producers; i++ {
		device := fmt.Sprintf("%s-%04d", cfg.Prefix, i)
		token, _, err := s.Credentials().IssueCredential(ctx, cfg.Tenant, cfg.Account, device, "service")
		if err != nil {
			return Creds{}, fmt.Errorf("issue credential for %s: %w", device, err)
		}
		c.Producers = append(c.Producers, Producer{Device: device, Token: token})
	}
	return c, nil
}

// WriteCreds writes the credentials file, owner-only, refusing to overwrite.
func WriteCreds(path string, c Creds) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode credentials: %w", err)
	}
	return access.WriteSecretFile(path, string(b)+"\n")
}

// ReadCreds reads and checks a credentials file.
func ReadCreds(path string) (Creds, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Creds{}, err
	}
	var c Creds
	if err := json.Unmarshal(b, &c); err != nil {
		return Creds{}, fmt.Errorf("%s is not a credentials file: %w", path, err)
	}
	if c.Tenant == "" || len(c.Producers) == 0 {
		return Creds{}, fmt.Errorf("%s names no tenant or no producers", path)
	}
	if c.Outbox && (!identityRE.MatchString(c.Project) || c.Topic == "") {
		return Creds{}, fmt.Errorf("%s: an outbox file names no project or topic", path)
	}
	for i, p := range c.Producers {
		if c.Outbox {
			if p.Device == "" {
				return Creds{}, fmt.Errorf("%s: producer %d lacks device", path, i)
			}
			if err := access.CheckToken(p.Token); err != nil {
				return Creds{}, fmt.Errorf("%s: producer %s: %w", path, p.Device, err)
			}
			continue
		}
		if p.Device == "" || p.KeyID == "" {
			return Creds{}, fmt.Errorf("%s: producer %d lacks device or key_id", path, i)
		}
		if err := access.CheckToken(p.Token); err != nil {
			return Creds{}, fmt.Errorf("%s: producer %s: %w", path, p.Device, err)
		}
		if _, err := access.ParseSeed(p.Seed); err != nil {
			return Creds{}, fmt.Errorf("%s: producer %s: %w", path, p.Device, err)
		}
	}
	return c, nil
}

// identityRE is the contract's identity rule.
var identityRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

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
	"github.com/envelopeworker/envelopeworker/tools/internal/producer"
)

// Producer is one simulated device: its credential and signing key.
type Producer struct {
	Device string `json:"device"`
	KeyID  string `json:"key_id"`
	Token  string `json:"token"`
	Seed   string `json:"seed"`
}

// Creds is the credentials file Setup writes and Run reads.
type Creds struct {
	Tenant    string     `json:"tenant"`
	Account   string     `json:"account"`
	Producers []Producer `json:"producers"`
}

// MaxProducers bounds setup and run; far beyond any loopback measurement's useful concurrency.
const MaxProducers = 4096

// SetupConfig names what Setup creates: producers <prefix>-0001 … with key ids equal to the device ids.
type SetupConfig struct {
	Tenant, Account, Prefix string
	Producers               int
}

// Setup issues a device credential and registers a fresh key for each producer.
func Setup(ctx context.Context, s *store.Store, cfg SetupConfig) (Creds, error) {
	if cfg.Producers < 1 || cfg.Producers > MaxProducers {
		return Creds{}, fmt.Errorf("producers must be 1-%d", MaxProducers)
	}
	c := Creds{Tenant: cfg.Tenant, Account: cfg.Account}
	for i := 1; i <= cfg.Producers; i++ {
		device := fmt.Sprintf("%s-%04d", cfg.Prefix, i)
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return Creds{}, fmt.Errorf("generate key: %w", err)
		}
		if err := s.AddKey(ctx, cfg.Tenant, device, pub); err != nil {
			if errors.Is(err, store.ErrConflict) {
				return Creds{}, fmt.Errorf("key id %s already exists in tenant %s: use another --prefix: %w", device, cfg.Tenant, err)
			}
			return Creds{}, fmt.Errorf("add key %s: %w", device, err)
		}
		token, _, err := s.IssueCredential(ctx, cfg.Tenant, cfg.Account, device, "device")
		if err != nil {
			return Creds{}, fmt.Errorf("issue credential for %s: %w", device, err)
		}
		c.Producers = append(c.Producers, Producer{
			Device: device, KeyID: device, Token: token, Seed: producer.EncodeBase64URL(priv.Seed()),
		})
	}
	return c, nil
}

// WriteCreds writes the credentials file, owner-only, refusing to overwrite.
func WriteCreds(path string, c Creds) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode credentials: %w", err)
	}
	return producer.WriteSecretFile(path, string(b)+"\n")
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
	for i, p := range c.Producers {
		if p.Device == "" || p.KeyID == "" {
			return Creds{}, fmt.Errorf("%s: producer %d lacks device or key_id", path, i)
		}
		if err := producer.CheckToken(p.Token); err != nil {
			return Creds{}, fmt.Errorf("%s: producer %s: %w", path, p.Device, err)
		}
		if _, err := producer.ParseSeed(p.Seed); err != nil {
			return Creds{}, fmt.Errorf("%s: producer %s: %w", path, p.Device, err)
		}
	}
	return c, nil
}

// identityRE is the contract's identity rule.
var identityRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

package store_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// A store on a freshly migrated database: a credential issued, verified by
// its token and revoked, and a stream's state read and its replay floor
// raised (what envctl and the services do).
func Example() {
	ctx := context.Background()
	dsn, drop := exampleDatabase(ctx)
	defer drop()

	st, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 2, ApplicationName: "example"})
	if err != nil {
		panic(err)
	}
	defer st.Close()

	creds, inbound := st.Credentials(), st.Inbound() // a caller keeps the concerns it uses
	token, id, err := creds.IssueCredential(ctx, "tenant-a", "acct-1", "device-7", store.RoleDevice)
	if err != nil {
		panic(err)
	}
	who, err := creds.VerifyCredential(ctx, token) // only the token's SHA-256 is stored and looked up
	fmt.Println(who.TenantID, who.DeviceID, who.Role, who.CredentialID == id, err)
	if err := creds.RevokeCredential(ctx, "tenant-a", id); err != nil {
		panic(err)
	}
	_, err = creds.VerifyCredential(ctx, token)
	fmt.Println("revoked:", errors.Is(err, store.ErrNotFound))

	s, err := inbound.Stream(ctx, "tenant-a", "proj-1", "device-7") // never written: zero
	fmt.Println(s.Cursor, s.ReplayFloor, err)
	s, err = inbound.SetReplayFloor(ctx, "tenant-a", "proj-1", "device-7", 10)
	fmt.Println(s.Cursor, s.ReplayFloor, err)
	_, err = inbound.Stream(ctx, "tenant-a", "proj 1", "device-7")
	fmt.Println("bad id:", errors.Is(err, store.ErrInvalid))
	// Output:
	// tenant-a device-7 device true <nil>
	// revoked: true
	// 0 0 <nil>
	// 10 10 <nil>
	// bad id: true
}

// exampleDatabase creates and migrates an empty database on the test
// server, as envctl migrate would, and returns its DSN and how to drop it.
func exampleDatabase(ctx context.Context) (dsn string, drop func()) {
	admin, err := sql.Open("pgx", storetest.AdminDSN())
	if err != nil {
		panic(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "envelopeworker_example_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		panic(err)
	}
	dsn = storetest.WithDatabase(storetest.AdminDSN(), name)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		panic(err)
	}
	if _, err := migrations.Apply(ctx, db); err != nil {
		panic(err)
	}
	_ = db.Close()
	return dsn, func() {
		_, _ = admin.ExecContext(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		_ = admin.Close()
	}
}

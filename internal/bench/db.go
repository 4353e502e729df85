package bench

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Server is a PostgreSQL server the harness makes its databases on, by a base URL without a database
// (postgres://postgres@127.0.0.1:5432, what scripts/devdb.sh url prints).
type Server struct{ Base string }

// URL is the URL of database name on the server.
func (s Server) URL(name string) string {
	u, err := url.Parse(strings.TrimRight(s.Base, "/"))
	if err != nil {
		return s.Base + "/" + name
	}
	u.Path = "/" + name
	q := u.Query()
	if q.Get("sslmode") == "" {
		q.Set("sslmode", "disable")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func (s Server) admin(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, s.URL("postgres"))
}

// Fresh drops database name if it exists and creates it empty.
func (s Server) Fresh(ctx context.Context, name string) error {
	if err := s.Drop(ctx, name); err != nil {
		return fmt.Errorf("drop %s: %w", name, err)
	}
	c, err := s.admin(ctx)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	return nil
}

// Drop drops database name.
func (s Server) Drop(ctx context.Context, name string) error {
	c, err := s.admin(ctx)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// Query1 runs a query returning one integer on database name.
func (s Server) Query1(ctx context.Context, name, sql string, args ...any) (int64, error) {
	c, err := pgx.Connect(ctx, s.URL(name))
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var n int64
	err = c.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// Analyze runs ANALYZE on database name: what autovacuum would have done once the warm-up's rows are in (this
// machine runs with autovacuum off). It also makes every open session plan its statements again: a plan a server
// cached while its tables were empty (a scan of them) would otherwise stay for good.
func (s Server) Analyze(ctx context.Context, name string) error {
	c, err := pgx.Connect(ctx, s.URL(name))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "ANALYZE")
	return err
}

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The baseline is ../shared/bench/servers/baseline ported as it is: the same ticket insert with gin + gorm and
// no idempotency at all, what a service without any of retrysafe costs on this stack. Nothing from the project
// is used, so that the only difference between it and `retrysafe serve tickets` is what the project adds.

// baselineTicket is the tickets-like table of the baseline (gorm AutoMigrate creates it).
type baselineTicket struct {
	ID        string    `gorm:"primaryKey" json:"id"`
	AccountID string    `json:"-"`
	Project   string    `json:"project"`
	Title     string    `json:"title"`
	Priority  string    `json:"priority"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

func (baselineTicket) TableName() string { return "tickets" }

type baselineCreate struct {
	Project  string `json:"project" binding:"required"`
	Title    string `json:"title" binding:"required"`
	Priority string `json:"priority"`
}

// ServeBaseline serves POST /v1/tickets (and GET /healthz, for the harness to wait on) at addr on databaseURL
// until ctx ends.
func ServeBaseline(ctx context.Context, databaseURL, addr string) error {
	db, closeDB, err := openReference(databaseURL, &baselineTicket{})
	if err != nil {
		return err
	}
	defer closeDB()
	r := gin.New()
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.POST("/v1/tickets", func(c *gin.Context) {
		var in baselineCreate
		if err := c.ShouldBindJSON(&in); err != nil {
			c.JSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		t := newBaselineTicket(referenceAccount(c), in)
		if err := db.WithContext(c).Create(&t).Error; err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": "insert failed"})
			return
		}
		c.JSON(http.StatusCreated, t)
	})
	return serveReference(ctx, addr, r)
}

// referenceAccount is the account of a reference server's request: the bearer secret, as in the shared
// baseline (no key lookup).
func referenceAccount(c *gin.Context) string {
	return strings.TrimPrefix(c.GetHeader("Authorization"), "Bearer ")
}

// newBaselineTicket is the ticket the reference servers insert for in: a new id, the default priority.
func newBaselineTicket(account string, in baselineCreate) baselineTicket {
	if in.Priority == "" {
		in.Priority = "normal"
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return baselineTicket{ID: "tkt_" + hex.EncodeToString(b), AccountID: account, Project: in.Project, Title: in.Title,
		Priority: in.Priority, Status: "open", CreatedAt: time.Now().UTC()}
}

// openReference opens a reference server's pool as the shared baseline does (gorm, no default transaction, 20
// connections) and creates its tables.
func openReference(databaseURL string, tables ...any) (*gorm.DB, func(), error) {
	gin.SetMode(gin.ReleaseMode)
	db, err := gorm.Open(postgres.Open(databaseURL), &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		return nil, nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, nil, err
	}
	sqlDB.SetMaxOpenConns(20)
	sqlDB.SetMaxIdleConns(20)
	if err := db.AutoMigrate(tables...); err != nil {
		sqlDB.Close()
		return nil, nil, err
	}
	return db, func() { sqlDB.Close() }, nil
}

// serveReference serves r at addr until ctx ends.
func serveReference(ctx context.Context, addr string, r http.Handler) error {
	srv := &http.Server{Addr: addr, Handler: r, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

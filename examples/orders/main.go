// Command orders is a small orders API on gin and gorm, made retry-safe with pkg/idem: the service of README's
// "Use retrysafe in your service", to copy. Its database is opened the usual way, gorm.Open(postgres.Open(dsn),
// &gorm.Config{}), with gorm's default transaction on, and its write is a tx.Create: idem runs it inside the
// transaction that holds the idempotency key's claim, whatever the gorm configuration.
//
//	DATABASE_URL=postgres://... API_KEYS=acct_shop:agent:<24+ characters> API_KEY_ID_SECRET=<32+ characters> \
//	  ADDR=127.0.0.1:8097 go run .
//
// POST /v1/orders {"customer": "...", "sku": "...", "quantity": N} with an Idempotency-Key creates an order once
// per key; GET /v1/orders?customer= lists a customer's orders; GET /v1/operations?idempotency_key=K tells a caller
// that timed out what happened to its write. Callers send Authorization: Bearer <secret of API_KEYS>, and see
// only their account's orders and operations. It is its own module (go.mod, with a replace to this repository);
// `make test` builds it and runs `retrysafe conformance` on it, every case including a worker killed after its
// claim (scripts/example-conformance.sh). RETRYSAFE_FAILPOINTS lets that test stop it right after a
// claim; idem.New arms it, nothing here does.
package main

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/migrations"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Order is one order of an account; its id is derived from the operation that created it.
type Order struct {
	ID        string    `json:"id" gorm:"primaryKey"`
	AccountID string    `json:"-" gorm:"index:example_orders_customer,priority:1"`
	Customer  string    `json:"customer" gorm:"index:example_orders_customer,priority:2"`
	SKU       string    `json:"sku"`
	Quantity  int       `json:"quantity"`
	CreatedAt time.Time `json:"created_at"`
}

// TableName keeps the example's table apart from the library's.
func (Order) TableName() string { return "example_orders" }

type createOrder struct {
	Customer string `json:"customer"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// Validate runs before the claim (httpjson.DecodeCommand): a refused request never burns its key.
func (c *createOrder) Validate() error {
	var fields []problem.FieldError
	fields = problem.CheckText(fields, "customer", c.Customer, 100, true)
	fields = problem.CheckText(fields, "sku", c.SKU, 100, true)
	if c.Quantity < 1 || c.Quantity > 1000 {
		fields = append(fields, problem.FieldError{Field: "quantity", Message: "must be 1 to 1000"})
	}
	if len(fields) > 0 {
		return problem.Validation(fields...)
	}
	return nil
}

// routes mounts the orders API and the operations routes on api, which is behind auth.Middleware; pool is the
// *sql.DB under db, as the operations routes take it.
func routes(api gin.IRouter, db *gorm.DB, pool *sql.DB, h *idem.Handler) {
	api.POST("/v1/orders", func(c *gin.Context) {
		var cmd createOrder
		if err := httpjson.DecodeCommand(c.Request, &cmd); err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		account := auth.From(c.Request.Context()).AccountID
		idemgin.Do(h, c, idem.Request{Kind: "orders.create", Command: cmd},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				o := Order{ID: "ord_" + strings.TrimPrefix(op.ID, "op_"), AccountID: account,
					Customer: cmd.Customer, SKU: cmd.SKU, Quantity: cmd.Quantity}
				if err := tx.Create(&o).Error; err != nil { // inside the claim's transaction
					return idem.Result{}, err // rolls the claim back: the key stays free
				}
				return idem.Result{Status: http.StatusCreated, Body: o, Resource: &opstatus.Resource{Type: "order", ID: o.ID}}, nil
			})
	})
	api.GET("/v1/orders", func(c *gin.Context) {
		var orders []Order
		err := db.WithContext(c.Request.Context()).Where("account_id = ? AND customer = ?", auth.From(c.Request.Context()).AccountID, c.Query("customer")).
			Order("created_at").Limit(1000).Find(&orders).Error
		if err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		httpserver.JSON(c, http.StatusOK, gin.H{"items": orders})
	})
	httpserver.Mount(api, opstatus.Routes(pool)) // GET /v1/operations/{id}, .../timeline, ?idempotency_key=K
}

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	slog.SetDefault(logger)
	if err := run(logger); err != nil {
		logger.Error("orders stopped", "error", err.Error())
		os.Exit(1)
	}
}

func run(logger *slog.Logger) error {
	dsn, addr := os.Getenv("DATABASE_URL"), os.Getenv("ADDR")
	if dsn == "" {
		return errors.New("set DATABASE_URL")
	}
	if addr == "" {
		addr = "127.0.0.1:8097"
	}
	keys, err := auth.ParseKeys(os.Getenv("API_KEYS"), os.Getenv("API_KEY_ID_SECRET"))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{})
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	sqlDB.SetMaxOpenConns(10)
	if err := migrations.Up(ctx, sqlDB); err != nil { // the library's tables
		return err
	}
	if err := db.AutoMigrate(&Order{}); err != nil { // the service's own
		return err
	}

	h, err := idem.New(db) // refuses a pool it cannot use (another driver, a transaction)
	if err != nil {
		return err
	}
	h.Logger = logger // responses replayed 72 h, keys kept 90 days (Retention, KeyLifetime)
	// Pruning, recovery of operations whose lease ran out, and sealing of the audit record, with their defaults.
	go h.RunBackground(ctx, idem.Background{})

	r := httpserver.NewRouter(httpserver.Options{Logger: logger, DB: sqlDB}) // access log, /healthz, /readyz
	routes(r.Group("", httpserver.Wrap(auth.Middleware(keys))), db, sqlDB, h)
	return httpserver.Serve(ctx, addr, r, logger, httpserver.Limits{})
}

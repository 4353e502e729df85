// Command nofingerprint is the orders API of examples/naive with the claim and the stored response done right,
// and one thing left out: it does not fingerprint the request. A retry gets the first answer again, marked
// Idempotent-Replayed, and concurrent copies wait for the first; but the same key with a different order is
// answered with the first order too, as if it had been done. `retrysafe conformance` fails it on case 4
// (changed payload) only.
//
//	DATABASE_URL=postgres://... SHOP_TOKEN=secret ADDR=:8096 go run ./examples/nofingerprint
//
// Its tables are nofp_orders and nofp_keys. It holds at most maxConns connections to the database, and logs
// every error it answers 500 for (JSON lines on stderr).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"
)

// Order is one order.
type Order struct {
	ID        int64     `json:"id" gorm:"primaryKey"`
	Customer  string    `json:"customer"`
	SKU       string    `json:"sku"`
	Quantity  int       `json:"quantity"`
	CreatedAt time.Time `json:"created_at"`
}

// TableName keeps the example's table apart from everything else in the schema.
func (Order) TableName() string { return "nofp_orders" }

// Key is a claimed idempotency key and, once the order is made, the answer to replay. Nothing here says what
// request the key was first used for: that is the missing fingerprint.
type Key struct {
	Key    string `gorm:"primaryKey"`
	Status int
	Body   []byte
	Done   bool
}

// TableName keeps the example's table apart from everything else in the schema.
func (Key) TableName() string { return "nofp_keys" }

type createOrder struct {
	Customer string `json:"customer" binding:"required,max=100"`
	SKU      string `json:"sku" binding:"required,max=100"`
	Quantity int    `json:"quantity" binding:"required,min=1,max=1000"`
}

// maxConns bounds the pool: concurrent copies of one request wait for a connection instead of opening one each,
// which past PostgreSQL's max_connections would fail them with 500s.
const maxConns = 10

// open connects to dsn with the pool bounded by maxConns.
func open(dsn string) (*gorm.DB, error) {
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: gormlogger.Discard})
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	return db, nil
}

// newServer serves POST /v1/orders and GET /v1/orders?customer=; token, when not empty, is the bearer secret.
// Every 500 is logged on logger with its cause; the client gets only the code.
func newServer(db *gorm.DB, token string, logger *slog.Logger) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery(), bearer(token))
	s := &server{db: db, logger: logger}
	r.POST("/v1/orders", s.postOrder)
	r.GET("/v1/orders", s.listOrders)
	return r
}

type server struct {
	db     *gorm.DB
	logger *slog.Logger
}

// internal logs err with msg and answers 500 with only the code.
func (s *server) internal(c *gin.Context, msg string, err error) {
	s.logger.ErrorContext(c, msg, "method", c.Request.Method, "path", c.Request.URL.Path, "error", err.Error())
	c.JSON(http.StatusInternalServerError, gin.H{"code": "internal"})
}

// postOrder makes the order once per Idempotency-Key, and answers a key already claimed with what is stored
// for it.
func (s *server) postOrder(c *gin.Context) {
	key, ok := c.Request.Header["Idempotency-Key"]
	if !ok || !validKey(key[0]) {
		c.JSON(http.StatusBadRequest, gin.H{"code": "idempotency_key_invalid"})
		return
	}
	var cmd createOrder
	if err := c.ShouldBindJSON(&cmd); err != nil {
		c.JSON(http.StatusBadRequest, gin.H{"code": "invalid_request"})
		return
	}
	body, replay, err := s.claimAndCreate(c, key[0], cmd)
	if err != nil {
		s.internal(c, "order not written", err)
		return
	}
	if !replay {
		c.Data(http.StatusCreated, "application/json", body)
		return
	}
	s.replay(c, key[0])
}

// claimAndCreate claims key and, when this request is the first to, makes the order and stores the answer
// with the key, in one transaction. replay says the key was claimed already.
func (s *server) claimAndCreate(ctx context.Context, key string, cmd createOrder) (body []byte, replay bool, err error) {
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// The claim, atomic: a concurrent copy waits here until this transaction ends.
		res := tx.Exec(`INSERT INTO nofp_keys (key, status, done) VALUES (?, 0, false) ON CONFLICT (key) DO NOTHING`, key)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			replay = true
			return nil
		}
		o := Order{Customer: cmd.Customer, SKU: cmd.SKU, Quantity: cmd.Quantity}
		if err := tx.Create(&o).Error; err != nil {
			return err
		}
		var err error
		if body, err = json.Marshal(o); err != nil {
			return err
		}
		return tx.Model(&Key{}).Where("key = ?", key).Updates(map[string]any{"status": http.StatusCreated, "body": body, "done": true}).Error
	})
	return body, replay, err
}

// replay answers with the answer stored for key, or 409 while its first request is still running.
func (s *server) replay(c *gin.Context, key string) {
	var stored Key
	if err := s.db.WithContext(c).Where("key = ?", key).First(&stored).Error; err != nil {
		s.internal(c, "stored answer not read", err)
		return
	}
	if !stored.Done {
		c.Header("Retry-After", "1")
		c.JSON(http.StatusConflict, gin.H{"code": "request_in_progress"})
		return
	}
	// The mistake: the stored answer is replayed whatever this request asks for.
	c.Header("Idempotent-Replayed", "true")
	c.Data(stored.Status, "application/json", stored.Body)
}

// listOrders lists a customer's orders, the first 1000.
func (s *server) listOrders(c *gin.Context) {
	orders := []Order{}
	if err := s.db.WithContext(c).Where("customer = ?", c.Query("customer")).Order("id").Limit(1000).Find(&orders).Error; err != nil {
		s.internal(c, "orders not listed", err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"items": orders})
}

func bearer(token string) gin.HandlerFunc {
	return func(c *gin.Context) {
		if token != "" && c.GetHeader("Authorization") != "Bearer "+token {
			c.AbortWithStatusJSON(http.StatusUnauthorized, gin.H{"code": "unauthorized"})
		}
	}
}

// validKey: 1 to 255 printable ASCII characters.
func validKey(k string) bool {
	if k == "" || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

func migrate(db *gorm.DB) error { return db.AutoMigrate(&Order{}, &Key{}) }

func main() {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		log.Fatal("nofingerprint: DATABASE_URL is required")
	}
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = ":8096"
	}
	db, err := open(dsn)
	if err != nil {
		log.Fatal(err)
	}
	if err := migrate(db); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Addr: addr, Handler: newServer(db, os.Getenv("SHOP_TOKEN"), slog.New(slog.NewJSONHandler(os.Stderr, nil))), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("nofingerprint orders API on %s", addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// Command naive is an orders API that copies the idempotency patterns only halfway, kept to show what
// `retrysafe conformance` catches. It requires an Idempotency-Key and remembers the key with the order, but it
// checks for the key and then inserts (no atomic claim), stores no response, and never compares the request with
// the first one. Conformance fails it on a lost response (the retry answers 200 where the first said 201, and
// unmarked), on concurrent copies (several orders for one key) and on a changed payload (the stored order is
// shown instead of a refusal).
//
//	DATABASE_URL=postgres://... SHOP_TOKEN=secret ADDR=:8095 go run ./examples/naive
//
// Its table is naive_orders. Do not copy it; see services/tickets for the real thing.
package main

import (
	"context"
	"errors"
	"log"
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

// Order is one order; IdempotencyKey is the key it was created under.
type Order struct {
	ID             int64     `json:"id" gorm:"primaryKey"`
	IdempotencyKey string    `json:"-" gorm:"index"`
	Customer       string    `json:"customer"`
	SKU            string    `json:"sku"`
	Quantity       int       `json:"quantity"`
	CreatedAt      time.Time `json:"created_at"`
}

// TableName keeps the example's table apart from everything else in the schema.
func (Order) TableName() string { return "naive_orders" }

type createOrder struct {
	Customer string `json:"customer" binding:"required,max=100"`
	SKU      string `json:"sku" binding:"required,max=100"`
	Quantity int    `json:"quantity" binding:"required,min=1,max=1000"`
}

// reserveStock stands for the work the handler does between its check and its insert (a stock reservation
// call): the window in which a concurrent copy of the request passes the same check.
var reserveStock = func() { time.Sleep(20 * time.Millisecond) }

// newServer serves POST /v1/orders and GET /v1/orders?customer=; token, when not empty, is the bearer secret.
func newServer(db *gorm.DB, token string) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery(), bearer(token))
	r.POST("/v1/orders", func(c *gin.Context) {
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
		// The mistake: check, then insert. Two copies can both find nothing.
		var existing Order
		err := db.WithContext(c).Where("idempotency_key = ?", key[0]).First(&existing).Error
		if err == nil {
			c.JSON(http.StatusOK, existing) // "already done": whatever is stored, for whatever was asked
			return
		}
		if !errors.Is(err, gorm.ErrRecordNotFound) {
			c.JSON(http.StatusInternalServerError, gin.H{"code": "internal"})
			return
		}
		reserveStock()
		o := Order{IdempotencyKey: key[0], Customer: cmd.Customer, SKU: cmd.SKU, Quantity: cmd.Quantity}
		if err := db.WithContext(c).Create(&o).Error; err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"code": "internal"})
			return
		}
		c.JSON(http.StatusCreated, o)
	})
	r.GET("/v1/orders", func(c *gin.Context) {
		orders := []Order{}
		if err := db.WithContext(c).Where("customer = ?", c.Query("customer")).Order("id").Limit(1000).Find(&orders).Error; err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"code": "internal"})
			return
		}
		c.JSON(http.StatusOK, gin.H{"items": orders})
	})
	return r
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

func migrate(db *gorm.DB) error { return db.AutoMigrate(&Order{}) }

func main() {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		log.Fatal("naive: DATABASE_URL is required")
	}
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = ":8095"
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: gormlogger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := migrate(db); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Addr: addr, Handler: newServer(db, os.Getenv("SHOP_TOKEN")), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("naive orders API on %s", addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

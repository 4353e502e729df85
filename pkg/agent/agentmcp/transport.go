package agentmcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Limits on one message a client sends to [Transport]. A message over either is refused on its own (see
// [Transport]); the messages after it are served.
const (
	// MaxMessageBytes bounds one line, that is one JSON-RPC message. Tool arguments carry at most a service's
	// request body (1 MiB by default), escaped once more inside the message.
	MaxMessageBytes = 4 << 20
	// MaxMessageDepth bounds how deeply arrays and objects nest in one message. The envelope takes three
	// levels (message, params, arguments) and no tool's arguments need more than a few.
	MaxMessageDepth = 64
)

// idPrefixBytes is how much of a line over MaxMessageBytes is kept to find its id: clients write the id
// before the params.
const idPrefixBytes = 64 << 10

// Transport is MCP's stdio transport (one JSON-RPC message per line, as the specification has it) made to
// outlast what arrives on In. A message longer than MaxMessageBytes, nested deeper than MaxMessageDepth, not
// JSON, not JSON-RPC or a batch (removed from MCP in 2025-06-18) is refused alone: answered with a JSON-RPC
// error when its id can be read, logged and skipped when not. At the end of In, the requests already read are
// answered before the session ends, so that a client that writes its requests and closes its end gets every
// answer and every call is carried out.
type Transport struct {
	In  io.Reader
	Out io.Writer
	// Logger gets one line per refused message (never its content); nil means slog.Default().
	Logger *slog.Logger
}

var _ mcp.Transport = (*Transport)(nil)

// Connect implements mcp.Transport; it is called once.
func (t *Transport) Connect(context.Context) (mcp.Connection, error) {
	c := &conn{
		in: t.In, out: t.Out, log: t.Logger,
		incoming: make(chan jsonrpc.Message),
		closed:   make(chan struct{}),
		pending:  map[jsonrpc.ID]bool{},
		answered: make(chan struct{}, 1),
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	go c.readLoop()
	return c, nil
}

type conn struct {
	in  io.Reader
	out io.Writer
	log *slog.Logger

	// incoming carries the accepted messages from readLoop, which closes it at the end of input, readErr set.
	incoming chan jsonrpc.Message
	readErr  error

	closeOnce sync.Once
	closed    chan struct{}

	writeMu sync.Mutex

	// pending are the calls handed to the server and not answered yet; answered gets a token when the last
	// of them is answered.
	mu       sync.Mutex
	pending  map[jsonrpc.ID]bool
	answered chan struct{}
}

func (c *conn) SessionID() string { return "" }

// Read returns the next accepted message. At the end of input it first waits until every call already
// returned has been answered.
func (c *conn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closed:
		return nil, io.EOF
	case msg, ok := <-c.incoming:
		if ok {
			if req, isReq := msg.(*jsonrpc.Request); isReq && req.IsCall() {
				c.mu.Lock()
				// A second call with an id in flight is refused by the server without an id: not awaited.
				c.pending[req.ID] = true
				c.mu.Unlock()
			}
			return msg, nil
		}
	}
	for {
		c.mu.Lock()
		n := len(c.pending)
		c.mu.Unlock()
		if n == 0 {
			return nil, c.readErr
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closed:
			return nil, c.readErr
		case <-c.answered:
		}
	}
}

func (c *conn) Write(ctx context.Context, msg jsonrpc.Message) error {
	select {
	case <-c.closed:
		return mcp.ErrConnectionClosed
	default:
	}
	data, err := jsonrpc.EncodeMessage(msg)
	if err == nil {
		err = c.writeLine(data)
	}
	if resp, ok := msg.(*jsonrpc.Response); ok {
		// Answered, written or not: a failed write closes the connection anyway.
		c.mu.Lock()
		delete(c.pending, resp.ID)
		if len(c.pending) == 0 {
			select {
			case c.answered <- struct{}{}:
			default:
			}
		}
		c.mu.Unlock()
	}
	return err
}

func (c *conn) writeLine(data []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_, err := c.out.Write(append(data, '\n'))
	return err
}

func (c *conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		if cl, ok := c.in.(io.Closer); ok {
			err = cl.Close()
		}
	})
	return err
}

// readLoop reads In line by line, refuses what it must and hands the rest to Read.
func (c *conn) readLoop() {
	defer close(c.incoming)
	br := bufio.NewReaderSize(c.in, 64<<10)
	for {
		line, size, err := readLine(br)
		if size > 0 {
			if msg := c.accept(line, size); msg != nil {
				select {
				case c.incoming <- msg:
				case <-c.closed:
					return
				}
			}
		}
		if err != nil {
			c.readErr = err
			return
		}
	}
}

// readLine reads one line without its end and returns its size. A line longer than MaxMessageBytes is read to
// its end but only its first idPrefixBytes are returned; err is io.EOF after the last line.
func readLine(br *bufio.Reader) (line []byte, size int, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		size += len(chunk)
		if size <= MaxMessageBytes+2 { // room for "\r\n"
			line = append(line, chunk...)
		} else if len(line) < idPrefixBytes {
			line = append(line, chunk[:min(len(chunk), idPrefixBytes-len(line))]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if size <= MaxMessageBytes+2 {
			line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
			size = len(line)
		}
		return line, size, err
	}
}

// accept decodes one line, or refuses it and returns nil.
func (c *conn) accept(line []byte, size int) jsonrpc.Message {
	line = bytes.TrimSpace(line)
	if size <= MaxMessageBytes && len(line) == 0 {
		return nil
	}
	switch {
	case size > MaxMessageBytes:
		c.refuse(line, size, jsonrpc.CodeInvalidRequest, fmt.Sprintf("message longer than %d bytes", MaxMessageBytes))
	case nestsDeeper(line, MaxMessageDepth):
		c.refuse(line, size, jsonrpc.CodeInvalidRequest, fmt.Sprintf("message nested deeper than %d levels", MaxMessageDepth))
	case !json.Valid(line):
		c.refuse(line, size, jsonrpc.CodeParseError, "message is not JSON")
	case line[0] == '[':
		var batch []json.RawMessage
		_ = json.Unmarshal(line, &batch)
		if len(batch) == 0 {
			c.refuse(line, size, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported")
		}
		for _, m := range batch {
			c.refuse(m, size, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported")
		}
	default:
		msg, err := jsonrpc.DecodeMessage(line)
		if err != nil {
			c.refuse(line, size, jsonrpc.CodeInvalidRequest, "message is not a JSON-RPC 2.0 request, notification or response")
			return nil
		}
		return msg
	}
	return nil
}

// refuse answers a refused request by its id, if its first bytes show one, and logs the refusal.
func (c *conn) refuse(head []byte, size, code int, reason string) {
	id, request := envelope(head)
	answered := false
	if id != nil && request {
		resp := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}`, id, code, strconv.Quote(reason+": refused, the next messages are served"))
		answered = c.writeLine(resp) == nil
	}
	attrs := []any{"reason", reason, "bytes", size, "answered", answered}
	if id != nil {
		attrs = append(attrs, "id", string(id))
	}
	c.log.Warn("mcp: message refused", attrs...)
}

// nestsDeeper reports whether arrays and objects in b nest deeper than limit, in one pass that skips strings.
func nestsDeeper(b []byte, limit int) bool {
	depth, inString, escaped := 0, false, false
	for _, ch := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
			}
		case ch == '"':
			inString = true
		case ch == '{' || ch == '[':
			depth++
			if depth > limit {
				return true
			}
		case ch == '}' || ch == ']':
			depth--
		}
	}
	return false
}

// envelope reads a message's id from its top-level members, as far as they are complete and valid JSON (a
// refused message may be cut short or broken further on). request is false when a member shows a response
// (result or error), which is never answered.
func envelope(b []byte) (id json.RawMessage, request bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	request = true
	for dec.More() {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			break
		}
		if key == "result" || key == "error" {
			request = false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			break
		}
		if key == "id" && plainID(v) {
			id = v
		}
	}
	return id, request
}

// plainID reports whether v is a JSON-RPC id worth echoing: a string or a number, short.
func plainID(v json.RawMessage) bool {
	if len(v) == 0 || len(v) > 200 {
		return false
	}
	var s string
	var n json.Number
	return json.Unmarshal(v, &s) == nil || json.Unmarshal(v, &n) == nil
}

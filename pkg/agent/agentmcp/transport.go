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

	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/jsondepth"
)

// Limits on one message a client sends to [Transport]. A message over either is refused on its own (see
// [Transport]); the messages after it are served.
const (
	// MaxMessageBytes bounds one line, that is one JSON-RPC message. Tool arguments carry at most a service's
	// request body (1 MiB by default), escaped once more inside the message.
	MaxMessageBytes = 4 << 20
	// MaxMessageDepth bounds how deeply arrays and objects nest in one message: the one limit of every JSON
	// retrysafe reads. The envelope takes three levels (message, params, arguments) and no tool's arguments
	// need more than a few.
	MaxMessageDepth = jsondepth.Max
)

// Transport is MCP's stdio transport (one JSON-RPC message per line, as the specification has it) made to
// outlast what arrives on In. A message longer than MaxMessageBytes, nested deeper than MaxMessageDepth, not
// JSON, not JSON-RPC or a batch (removed from MCP in 2025-06-18) is refused alone: answered with a JSON-RPC
// error when its id can be read, logged and skipped when not. At the end of In, the requests already read are
// answered before the session ends, so that a client that writes its requests and closes its end gets every
// answer and every call is carried out. Closing the session closes In if it is an io.Closer.
//
// A call is answered with its id exactly as the client wrote it. The SDK holds an id as a string or an int64,
// so an id it would write back otherwise (a number beyond int64, a fraction or an exponent, a string written
// with escapes) is handed to it as an alias and written back as received; such a call cannot be named by
// notifications/cancelled.
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
		aliases:  newAliases(),
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

	aliases *aliases
}

// aliases are the ids given to the SDK for calls whose ids it would not write back as received.
type aliases struct {
	mu     sync.Mutex
	prefix string                     // unguessable, so no client id is taken for an alias
	next   int                        // numbers the aliases
	wire   map[string]json.RawMessage // alias -> the id as the client wrote it
	of     map[string]string          // the id as written -> its alias, while the call is in flight
}

func newAliases() *aliases {
	return &aliases{prefix: ids.New("mcpid_") + ":", wire: map[string]json.RawMessage{}, of: map[string]string{}}
}

// forCall returns the id to hand the SDK for a call whose id the client wrote as raw and the SDK decoded as
// id: id itself when the SDK writes it back as raw, else an alias (the same one for a second call with the
// same id in flight, which the SDK then refuses as it would any duplicate).
func (a *aliases) forCall(id jsonrpc.ID, raw []byte) jsonrpc.ID {
	if back, err := json.Marshal(id.Raw()); err == nil && bytes.Equal(back, raw) {
		return id
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	alias, ok := a.of[string(raw)]
	if !ok {
		a.next++
		alias = a.prefix + strconv.Itoa(a.next)
		a.of[string(raw)], a.wire[alias] = alias, bytes.Clone(raw)
	}
	aliasID, _ := jsonrpc.MakeID(alias) // a string is always an id
	return aliasID
}

// wireID returns the id as the client wrote it for an aliased call's answer, and forgets the alias.
func (a *aliases) wireID(id jsonrpc.ID) (json.RawMessage, bool) {
	alias, ok := id.Raw().(string)
	if !ok {
		return nil, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	raw, ok := a.wire[alias]
	if ok {
		delete(a.wire, alias)
		delete(a.of, string(raw))
	}
	return raw, ok
}

// withID is msg, as the SDK encoded it, with its id replaced by raw.
func withID(msg []byte, raw json.RawMessage) ([]byte, error) {
	var m struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result,omitempty"`
		Error   json.RawMessage `json:"error,omitempty"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		return nil, err
	}
	m.ID = raw
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
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
	resp, isResp := msg.(*jsonrpc.Response)
	if err == nil && isResp {
		if raw, ok := c.aliases.wireID(resp.ID); ok {
			data, err = withID(data, raw)
		}
	}
	if err == nil {
		err = c.writeLine(data)
	}
	if isResp {
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
		var scan frameScan
		line, size, err := readLine(br, &scan)
		if size > 0 {
			if msg := c.accept(line, size, &scan); msg != nil {
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

// readLine reads one line, passing every byte to scan, and returns it without its end, with its size. A line
// longer than MaxMessageBytes is read to its end but not kept; err is io.EOF after the last line.
func readLine(br *bufio.Reader, scan *frameScan) (line []byte, size int, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		scan.write(chunk)
		size += len(chunk)
		if size <= MaxMessageBytes+2 { // room for "\r\n"
			line = append(line, chunk...)
		} else {
			line = nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if line != nil {
			line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
			size = len(line)
		}
		return line, size, err
	}
}

// accept decodes one line, or refuses it and returns nil.
func (c *conn) accept(line []byte, size int, scan *frameScan) jsonrpc.Message {
	line = bytes.TrimSpace(line)
	if size <= MaxMessageBytes && len(line) == 0 {
		return nil
	}
	switch {
	case size > MaxMessageBytes:
		c.refuse(scan, size, jsonrpc.CodeInvalidRequest, fmt.Sprintf("message longer than %d bytes", MaxMessageBytes))
	case jsondepth.Check(line) != nil:
		c.refuse(scan, size, jsonrpc.CodeInvalidRequest, fmt.Sprintf("message nested deeper than %d levels", MaxMessageDepth))
	case !json.Valid(line):
		c.refuse(scan, size, jsonrpc.CodeParseError, "message is not JSON")
	case line[0] == '[':
		var batch []json.RawMessage
		_ = json.Unmarshal(line, &batch)
		if len(batch) == 0 {
			c.refuse(scan, size, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported")
		}
		for _, m := range batch {
			var member frameScan
			member.write(m)
			c.refuse(&member, size, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported")
		}
	default:
		msg, err := jsonrpc.DecodeMessage(line)
		if err != nil {
			c.refuse(scan, size, jsonrpc.CodeInvalidRequest, "message is not a JSON-RPC 2.0 request, notification or response")
			return nil
		}
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
			raw, err := scan.wireID(line)
			if err != nil {
				c.refuse(scan, size, jsonrpc.CodeInvalidRequest, "message's id cannot be read")
				return nil
			}
			req.ID = c.aliases.forCall(req.ID, raw)
		}
		return msg
	}
	return nil
}

// refuse answers a refused request by its id, if it has one, and logs the refusal.
func (c *conn) refuse(scan *frameScan, size, code int, reason string) {
	id := scan.plainID()
	answered := false
	if id != nil && !scan.response {
		resp := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}`, id, code, strconv.Quote(reason+": refused, the next messages are served"))
		answered = c.writeLine(resp) == nil
	}
	attrs := []any{"reason", reason, "bytes", size, "answered", answered}
	if id != nil {
		attrs = append(attrs, "id", string(id))
	}
	c.log.Warn("mcp: message refused", attrs...)
}

// frameScan reads a message in one pass, as its bytes arrive and in constant memory: how deeply it nests,
// and the id and kind its top-level members give. A message refused for its size or depth is thus answered
// by its id wherever the id stands (clients write it before or after the params), even when the message is
// never held whole. Broken JSON gives what could be read.
type frameScan struct {
	depth             int
	inString, escaped bool
	expectKey, inKey  bool   // at the top level, the next string names a member; reading that name
	key               []byte // the member name, its first maxKeyBytes
	keyLong           bool
	inID, idDone      bool
	id                []byte // the id's value as written, its first maxIDBytes
	idLong            bool
	response          bool // a result or error member: a response, never answered
}

const (
	maxKeyBytes = 8
	maxIDBytes  = 200
)

func (s *frameScan) write(p []byte) {
	for _, ch := range p {
		s.step(ch)
	}
}

func (s *frameScan) step(ch byte) {
	top := s.depth == 1
	if s.inID {
		s.idByte(ch, top)
	}
	if s.inString {
		s.stringByte(ch)
		return
	}
	s.structureByte(ch, top)
}

// idByte keeps a byte of the id's value, which runs to the ',' or '}' that ends its member.
func (s *frameScan) idByte(ch byte, top bool) {
	switch {
	case !s.inString && top && (ch == ',' || ch == '}'):
		s.inID, s.idDone = false, true
	case len(s.id) < maxIDBytes:
		s.id = append(s.id, ch)
	default:
		s.idLong = true
	}
}

// stringByte reads a byte inside a string: an escape, the closing quote, or a byte of a member's name.
func (s *frameScan) stringByte(ch byte) {
	switch {
	case s.escaped:
		s.escaped = false
	case ch == '\\':
		s.escaped = true
	case ch == '"':
		s.inString = false
		if s.inKey {
			s.inKey, s.expectKey = false, false
		}
		return
	}
	if s.inKey {
		if len(s.key) < maxKeyBytes {
			s.key = append(s.key, ch)
		} else {
			s.keyLong = true
		}
	}
}

// structureByte reads a byte outside strings: one that opens a string, nests, ends nesting, starts a member's
// value or separates members.
func (s *frameScan) structureByte(ch byte, top bool) {
	switch ch {
	case '"':
		s.inString = true
		if top && s.expectKey {
			s.inKey, s.key, s.keyLong = true, s.key[:0], false
		}
	case '{', '[':
		s.depth++
		s.expectKey = s.depth == 1 && ch == '{'
	case '}', ']':
		s.depth--
	case ':':
		if top && !s.keyLong {
			s.memberValue()
		}
	case ',':
		s.expectKey = top
	}
}

// memberValue starts the value of the top-level member just named: an id is kept as it is written; a result or
// an error makes the message a response.
func (s *frameScan) memberValue() {
	switch string(s.key) {
	case "id":
		s.inID, s.idDone, s.id, s.idLong = true, false, s.id[:0], false
	case "result", "error":
		s.response = true
	}
}

// wireID is the top-level id of line, the message scanned, as written: from the scan, or, when longer than the
// scan keeps, from line itself (its last "id" member, as the SDK reads it).
func (s *frameScan) wireID(line []byte) (json.RawMessage, error) {
	if s.idDone && !s.idLong {
		return bytes.TrimSpace(s.id), nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(line, &members); err != nil {
		return nil, err
	}
	return members["id"], nil
}

// plainID is the message's id if it is one worth echoing: complete, a string or a number, short.
func (s *frameScan) plainID() json.RawMessage {
	id := bytes.TrimSpace(s.id)
	if !s.idDone || s.idLong || len(id) == 0 {
		return nil
	}
	var str string
	var n json.Number
	if json.Unmarshal(id, &str) != nil && json.Unmarshal(id, &n) != nil {
		return nil
	}
	return id
}

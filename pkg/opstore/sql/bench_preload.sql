-- bench_preload.sql: loads completed ticket creates numbered [bench.from, bench.to) into a migrated retrysafe
-- database, for the growth benchmark (`make bench-growth`, cmd/retrysafe-bench -preload N, which runs it in
-- batches through opstore.BenchPreload). Each one leaves the rows a real `POST /v1/tickets` leaves once committed (services/tickets,
-- pkg/idem): the ticket, the operation (tickets.create, succeeded) holding its completed idempotency key with the
-- stored 201 answer, and its one event (completed, attempt 1). The events are left unsealed,
-- as after a burst of real creates: the service's audit sequencer seals them (the harness waits for it before it
-- measures).
--
-- One set-based statement per table (session_replication_role = replica turns the triggers, and the foreign
-- key checks, off for this session only: superuser, as the postgres user of the development server is).
-- The ids are UUIDv7-shaped, time
-- first, as ids.New makes them; the key is "preload-<n>", the account acct_a, the actor agent:preload; the
-- fingerprint is the real one of `{"project":"bench","title":"ticket preload-<n>","priority":"normal"}`, so
-- sending that request again with its key replays the stored 201.
--
-- By hand: PGOPTIONS='-c bench.from=0 -c bench.to=1000 -c bench.t0=2026-11-30T00:00:00Z' psql -v ON_ERROR_STOP=1 \
--   -d postgres://postgres@127.0.0.1:5432/DB -f pkg/opstore/sql/bench_preload.sql
SET session_replication_role = replica;
SET synchronous_commit = off;

BEGIN;
CREATE TEMP TABLE preload ON COMMIT DROP AS
WITH n AS (
    SELECT i, current_setting('bench.t0')::timestamptz + i * interval '1 microsecond' AS ts
    FROM generate_series(current_setting('bench.from')::bigint, current_setting('bench.to')::bigint - 1) AS i
), v AS (
    SELECT i, ts, audit_time(ts) AS t,
           lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') AS ms,
           md5('op' || i) AS hop, md5('tkt' || i) AS htk, md5('att' || i) AS hat,
           -- idem.Fingerprint of the request the harness sends for this key (services/tickets CreateTicket,
           -- defaults applied), so the key replays its stored answer to that request.
           encode(sha256(convert_to('{"account_id":"acct_a","command":{"description":"","priority":"normal","project":"bench","title":"ticket preload-'
                                    || i || '"},"method":"POST","params":{},"route":"/v1/tickets"}', 'UTF8')), 'hex') AS fingerprint
    FROM n
), ids AS (
    SELECT i, ts, t, fingerprint, 'preload-' || i AS key,
           'op_' || substr(ms, 1, 8) || '-' || substr(ms, 9, 4) || '-7' || substr(hop, 1, 3) || '-8' || substr(hop, 4, 3) || '-' || substr(hop, 7, 12) AS op,
           'tkt_' || substr(ms, 1, 8) || '-' || substr(ms, 9, 4) || '-7' || substr(htk, 1, 3) || '-8' || substr(htk, 4, 3) || '-' || substr(htk, 7, 12) AS tkt,
           'att_' || substr(ms, 1, 8) || '-' || substr(ms, 9, 4) || '-7' || substr(hat, 1, 3) || '-8' || substr(hat, 4, 3) || '-' || substr(hat, 7, 12) AS att
    FROM v
)
SELECT *,
       '{"attempt_id":"' || att || '","duration_ms":2,"fingerprint":"' || fingerprint || '","outcome":"created","status":201}' AS d
FROM ids;

INSERT INTO tickets (id, account_id, project, title, description, priority, status, created_at, updated_at)
SELECT tkt, 'acct_a', 'bench', 'ticket ' || key, '', 'normal', 'open', ts, ts FROM preload ORDER BY i;

INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id, created_at, updated_at,
                        key_state, response_status, response_headers, response_body, completed_at,
                        response_expires_at, key_expires_at)
SELECT op, 'acct_a', 'tickets.create', 'succeeded', key, fingerprint, 'ticket', tkt, ts, ts,
       'completed', 201, jsonb_build_object('Location', jsonb_build_array('/v1/tickets/' || tkt)),
       convert_to('{"id":"' || tkt || '","project":"bench","title":"ticket ' || key || '","description":"","priority":"normal",'
                  || '"status":"open","source_event_id":null,"created_at":"' || t || '","updated_at":"' || t || '","deduplicated":false}', 'UTF8'),
       ts, ts + interval '72 hours', ts + interval '90 days'
FROM preload ORDER BY i;

-- Ids after every id already taken.
INSERT INTO operation_events (id, operation_id, account_id, type, from_state, to_state, actor, detail, created_at)
SELECT b.base + (p.i - current_setting('bench.from')::bigint) + 1, p.op, 'acct_a', 'completed', 'running', 'succeeded',
       'agent:preload', p.d::jsonb, p.ts
FROM preload p
CROSS JOIN (SELECT coalesce(max(id), 0) AS base FROM operation_events) b
ORDER BY p.i;
SELECT setval('operation_events_id_seq', (SELECT max(id) FROM operation_events));
COMMIT;

-- +goose Up
-- audit_canonical follows RFC 8785 for every number and every member name, as auditchain.Canonical (Go) does:
-- the records the triggers chain and the ones Go writers link and verify recomputes are hashed over the same
-- bytes. FuzzTriggerCanonicalMatchesGo (pkg/audit) holds the two to each other.
--
-- Numbers: RFC 8785 writes the IEEE 754 double nearest to a number as its shortest text that reads back as that
-- double (the one nearest to it when several do), laid out as ECMAScript's Number.prototype.toString: no
-- exponent from 1e-6 to below 1e21; 1e+21, 1e-7; never 1e+17 or 1.50. jsonb keeps a number's exact decimal
-- value, and the API refuses at its edge any number that this would change (auditchain.ExactNumber), so the
-- decimal's own significant digits are the ones to lay out. audit_number proves it (15 digits within the
-- normal doubles always read back; otherwise no shorter text and no other of the same length reads back as the
-- same double) or else takes the double's shortest text from float8's output, which is PostgreSQL's and may
-- differ from Go's only for a number the edge refuses.
--
-- Member names: RFC 8785 sorts them by UTF-16 code units, which is code point order (COLLATE "C") except that
-- characters above U+FFFF (surrogate pairs, D800-DFFF) come before U+E000-U+FFFF. audit_name_order maps a name
-- to a text whose code point order is that order; names of ASCII alone, nearly all of them, are their own.

-- audit_float8 is the double nearest to v, as Go's strconv.ParseFloat rounds it: 0 below the smallest double,
-- an infinity beyond the largest (where float8 raises an error).
-- +goose StatementBegin
CREATE FUNCTION audit_float8(v numeric) RETURNS float8 LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    RETURN v::float8;
EXCEPTION WHEN numeric_value_out_of_range THEN
    RETURN CASE WHEN abs(v) < 1 THEN 0 WHEN v > 0 THEN 'Infinity'::float8 ELSE '-Infinity'::float8 END;
END
$$;
-- +goose StatementEnd

-- audit_float8_text is the shortest text of v that reads back as v (float8's output with extra_float_digits
-- above 0, whatever the session set).
-- +goose StatementBegin
CREATE FUNCTION audit_float8_text(v float8) RETURNS text LANGUAGE sql IMMUTABLE STRICT
SET extra_float_digits = 1 AS $$
    SELECT v::text
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION audit_number(v jsonb) RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    t text := v::text;
    neg boolean := left(t, 1) = '-';
    mantissa text;
    whole text;
    digits text;
    lead int;
    n int; -- |v| = 0.digits × 10^n
    k int;
    x numeric;
    d float8;
    shorter numeric;
    unit numeric;
BEGIN
    IF t ~ '^-?[0-9]{1,15}$' THEN
        RETURN t;
    END IF;
    -- Pass 1 reads jsonb's decimal text; pass 2, when it is not the double's shortest, float8's text of it.
    FOR pass IN 1..2 LOOP
        t := lower(ltrim(t, '-'));
        mantissa := split_part(t, 'e', 1);
        whole := split_part(mantissa, '.', 1);
        digits := whole || split_part(mantissa, '.', 2);
        lead := length(digits) - length(ltrim(digits, '0'));
        digits := rtrim(ltrim(digits, '0'), '0');
        IF digits = '' THEN
            RETURN '0';
        END IF;
        n := length(whole) - lead + coalesce(nullif(split_part(t, 'e', 2), '')::int, 0);
        k := length(digits);
        -- Up to 15 significant digits within the normal doubles, a decimal reads back from its double (DBL_DIG).
        EXIT WHEN pass = 2 OR (k <= 15 AND n BETWEEN -306 AND 308);
        x := abs(v::numeric);
        d := audit_float8(x);
        IF d = 0 THEN
            RETURN '0';
        ELSIF d = 'Infinity' THEN
            RAISE EXCEPTION 'audit: the number % is beyond the largest double, which RFC 8785 cannot write', v::text
                USING ERRCODE = 'numeric_value_out_of_range';
        END IF;
        unit := ('1e' || (n - k))::numeric;
        IF k > 1 THEN
            shorter := (left(digits, k - 1) || 'e' || (n - k + 1))::numeric;
            EXIT WHEN audit_float8(shorter) <> d AND audit_float8(shorter + 10 * unit) <> d
                  AND audit_float8(x - unit) <> d AND audit_float8(x + unit) <> d;
        ELSE
            EXIT WHEN audit_float8(x - unit) <> d AND audit_float8(x + unit) <> d;
        END IF;
        t := audit_float8_text(d);
    END LOOP;
    RETURN CASE WHEN neg THEN '-' ELSE '' END || CASE
        WHEN k <= n AND n <= 21 THEN digits || repeat('0', n - k)
        WHEN 0 < n AND n <= 21 THEN left(digits, n) || '.' || substr(digits, n + 1)
        WHEN -6 < n AND n <= 0 THEN '0.' || repeat('0', -n) || digits
        ELSE left(digits, 1) || CASE WHEN k > 1 THEN '.' || substr(digits, 2) ELSE '' END
             || 'e' || CASE WHEN n > 0 THEN '+' ELSE '-' END || abs(n - 1)::text
    END;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION audit_name_order(name text) RETURNS text LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT regexp_replace(regexp_replace(name, '([' || chr(57344) || '-' || chr(65535) || '])', chr(57345) || E'\\1', 'g'),
                          '([' || chr(65536) || '-' || chr(1114111) || '])', chr(57344) || E'\\1', 'g')
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION audit_canonical(v jsonb) RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    out text;
BEGIN
    CASE jsonb_typeof(v)
    WHEN 'object' THEN
        -- Scalars inline; only nested objects and arrays recurse, and numbers that are not short integers.
        SELECT '{' || coalesce(string_agg(to_json(e.key)::text || ':' || CASE jsonb_typeof(e.value)
                   WHEN 'object' THEN audit_canonical(e.value) WHEN 'array' THEN audit_canonical(e.value)
                   WHEN 'number' THEN CASE WHEN e.value::text ~ '^-?[0-9]{1,15}$' THEN e.value::text ELSE audit_number(e.value) END
                   ELSE e.value::text END,
               ',' ORDER BY CASE WHEN octet_length(e.key) = length(e.key) THEN e.key ELSE audit_name_order(e.key) END COLLATE "C"),
               '') || '}'
        INTO out FROM jsonb_each(v) AS e;
        RETURN out;
    WHEN 'array' THEN
        SELECT '[' || coalesce(string_agg(audit_canonical(e.value), ',' ORDER BY e.ord), '') || ']'
        INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, ord);
        RETURN out;
    WHEN 'number' THEN
        RETURN audit_number(v);
    ELSE
        RETURN v::text;
    END CASE;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION audit_canonical(v jsonb) RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    out text;
BEGIN
    CASE jsonb_typeof(v)
    WHEN 'object' THEN
        -- Scalars inline; only nested objects and arrays recurse.
        SELECT '{' || coalesce(string_agg(to_json(e.key)::text || ':' || CASE jsonb_typeof(e.value)
                   WHEN 'object' THEN audit_canonical(e.value) WHEN 'array' THEN audit_canonical(e.value)
                   -- audit_number written out: a call of it would not be inlined (it is STRICT, its CASE is not).
                   WHEN 'number' THEN CASE WHEN e.value::text ~ '^-?[0-9]{1,15}$' THEN e.value::text
                                           WHEN e.value::text ~ '^-?[0-9]{16}$' AND abs(e.value::text::numeric) <= 9007199254740992 THEN e.value::text
                                           ELSE (e.value::text::float8)::text END
                   ELSE e.value::text END,
               ',' ORDER BY e.key COLLATE "C"), '') || '}'
        INTO out FROM jsonb_each(v) AS e;
        RETURN out;
    WHEN 'array' THEN
        SELECT '[' || coalesce(string_agg(audit_canonical(e.value), ',' ORDER BY e.ord), '') || ']'
        INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, ord);
        RETURN out;
    WHEN 'number' THEN
        RETURN audit_number(v);
    ELSE
        RETURN v::text;
    END CASE;
END
$$;
-- +goose StatementEnd
DROP FUNCTION audit_name_order(text);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION audit_number(v jsonb) RETURNS text LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN v::text ~ '^-?[0-9]{1,15}$' THEN v::text
                WHEN v::text ~ '^-?[0-9]{16}$' AND abs(v::text::numeric) <= 9007199254740992 THEN v::text
                ELSE (v::text::float8)::text END
$$;
-- +goose StatementEnd
DROP FUNCTION audit_float8_text(float8);
DROP FUNCTION audit_float8(numeric);

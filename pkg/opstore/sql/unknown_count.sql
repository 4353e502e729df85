-- How many operations are unknown, and for how long (seconds) the oldest has been; operations_unknown is a
-- partial index WHERE unknown, so this reads only those rows.
SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(updated_at)), 0)::float8 FROM operations WHERE unknown

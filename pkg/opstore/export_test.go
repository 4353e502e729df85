package opstore

// LookupKeySQL is lookup_key.sql, whose plan a test checks.
var LookupKeySQL = lookupKeySQL

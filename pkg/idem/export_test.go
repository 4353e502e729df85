package idem

// LookupSQL is the statement Lookup runs, for the plan test.
var LookupSQL = numbered(lookupSQL)

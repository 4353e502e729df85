package idem

// LookupSQL is the statement Lookup runs, for the plan test.
var LookupSQL = numbered(lookupSQL)

// LookupManySQL is the statement LookupMany runs, for the plan test.
var LookupManySQL = lookupManySQL

package redisstore

import (
	"slices"

	"github.com/redis/go-redis/v9"
)

// A record is a Redis hash or a Redis string. As a hash, its fields, in
// the order the scripts return them (recordFields) and parseRecord reads
// them:
//
//	st  status              lu  lease until (ms)    le  last error
//	fp  fingerprint         ca  created at (ms)     ff  first failure (ms)
//	at  attempts            ua  updated at (ms)     lf  last failure (ms)
//	ow  owner token         ea  expires at (ms)     rs  result (absent: nil)
//
// and sn, the nonce of the settling write (Complete, Fail, Release) that last
// changed the record, which lets a write the client sent twice (go-redis
// retries a command whose connection broke) recognise its own first run.
//
// As a string, the same fields and sn packed in one value (packed.go), so
// that one native command reads or creates it: a Claim creates a record by
// SET NX GET, which answers the record already there instead, and a
// settled record (SUCCEEDED, FAILED_FINAL), which never changes again, is
// always a string, so that a replay costs the server a GET's work and no
// script. A record SET NX created stores its lease end and expiry relative
// ("+<ms>") to its creation, which the key's expiry, set by the server from
// its clock, fixes: readers resolve them with PEXPIRETIME. The scripts
// read both forms; each write keeps the record's form, but a settling
// write, which makes it a string. A record a script creates (ClaimBatch)
// is a hash, and the records of earlier versions, all hashes, keep being
// read.
//
// Times are Unix milliseconds from the server's TIME, read inside every
// script that writes or decides a lease, so a worker's clock never decides
// a lease. The key expires at ea (PEXPIREAT from the same clock), so Redis
// itself deletes expired records, on the first access past ea if not
// before: a claim that only reads (a replay, a conflict) takes the record
// it finds as live and does not read the clock. The scripts that read it
// still treat ea <= now as absent.
//
// Every script checks everything before its first write, and that write is
// one HSET or SET: a server refusing writes (MISCONF, READONLY, OOM)
// refuses it and the script stops with nothing changed. User input reaches
// the scripts only as KEYS and ARGV, never as script text.
var recordFields = []string{"st", "fp", "at", "ow", "lu", "ca", "ua", "ea", "le", "ff", "lf", "rs"}

// script is a Lua script with its text, which a call sends by EVAL when
// the server does not know the script (its cache was flushed, or it
// restarted).
type script struct {
	*redis.Script
	src string
	// hash is the script's hash as a command argument, boxed once.
	hash any
}

// newScript returns the script of src.
func newScript(src string) script {
	sc := redis.NewScript(src)
	return script{Script: sc, src: src, hash: sc.Hash()}
}

// eval returns the arguments of an EVAL that makes call c, whose arguments
// are an EVALSHA's.
func (sc script) eval(c call) []any {
	cmd := slices.Clone(c.cmd)
	cmd[0], cmd[1] = "eval", sc.src
	return cmd
}

// luaNow sets now to the server's time in milliseconds.
const luaNow = `local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
`

// claimSource is claimScript's text, which the client sends by EVAL when
// the server does not know the script (see Store.run).
//
// It claims KEYS in order, as one claim after another; for KEYS[i] ARGV
// holds four values from 4i-3: fingerprint, lease (ms), TTL (ms), new owner
// token. It answers with one flat array, per key in order:
//
//	2, now                        created: the client builds the record
//	1, previous status, 12 fields acquired: taken over, or held already by this very claim
//	0, result flag, 12 fields     refused: the client classifies the record
//	-1                            the stored record is malformed
//
// with the fields in recordFields' order as the record is after the claim,
// an absent one as "" (a script's false is no string under RESP3), and the
// result flag "1" when the record has a result (rs), else "".
//
// A hash is read by one HMGET: one call of 12 fields costs the server less
// than two of fewer; a string, which HMGET refuses as the wrong type, by
// one GET. A record settled (SUCCEEDED, FAILED_FINAL), stored
// with another fingerprint or held by this claim is answered from it alone:
// only a takeover or a creation reads the server's clock (TIME). The key's
// expiry is the record's (ea), so a record found is live: Redis deletes a
// key on the first access past its PEXPIREAT, inside a script too.
const claimSource = luaRecord + `local now
local out, n = {}, 0
for i, k in ipairs(KEYS) do
  local a = (i - 1) * 4
  local fp, lease, ttl, owner = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4]
  local r, str = load(k)
  local st, at, lu, ea = r[1], tonumber(r[3]), tonumber(r[5]), tonumber(r[8])
  -- code: 2 created, 1 taken over or held already by this very claim (sent
  -- again after a broken connection), 0 refused, -1 malformed.
  local code, aux = 0, ''
  if st == false and r[2] == false then
    code = 2
  elseif at == nil or lu == nil or ea == nil then
    code = -1
  elseif st == 'PROCESSING' and r[4] == owner then
    code = 1
  elseif r[2] == fp and (st == 'FAILED_RETRYABLE' or st == 'PROCESSING') then
    if not now then
      local t = redis.call('TIME')
      now = t[1] * 1000 + math.floor(t[2] / 1000)
    end
    if ea <= now then
      redis.call('DEL', k)
      code = 2
    elseif st == 'FAILED_RETRYABLE' or lu <= now then
      code, aux = 1, st
      r[1], r[3], r[4], r[5], r[7], r[8] = 'PROCESSING', at + 1, owner, now + lease, now, now + ttl
      put(k, r, str, now)
    end
  end
  if code == 2 then
    if not now then
      local t = redis.call('TIME')
      now = t[1] * 1000 + math.floor(t[2] / 1000)
    end
    redis.call('HSET', k, 'st', 'PROCESSING', 'fp', fp, 'at', 1, 'ow', owner,
      'lu', now + lease, 'ca', now, 'ua', now, 'ea', now + ttl)
    -- Last, because a TTL of zero deletes the record at once.
    redis.call('PEXPIREAT', k, now + ttl)
    out[n + 1], out[n + 2] = 2, now
    n = n + 2
  elseif code == -1 then
    out[n + 1] = -1
    n = n + 1
  else
    if code == 0 and r[12] then
      aux = '1'
    end
    out[n + 1], out[n + 2] = code, aux
    for j = 1, 12 do
      out[n + 2 + j] = text(r[j]) or ''
    end
    n = n + 14
  end
end
return out
`

// claimScript runs claimSource.
var claimScript = newScript(claimSource)

// luaRecord defines the functions that read and write a record in either
// form. load returns the record of k as HMGET answers recordFields and sn
// (false for an absent field) and whether it is a string; a string that is
// no record loads as status "?". pack returns the record r (as load
// answers it) as one string: a MessagePack array of its 13 values, the
// times and attempts as integers (see packed.go). setUntil sets k to v
// until ea (SET PX, not PXAT, which Redis before 6.2 lacks), or deletes it
// when ea has passed. put writes r back in the form it was loaded in,
// expiring at r[8]. text returns a field as a reply gives it: a number as
// its integer text.
const luaRecord = `local function load(k)
  if redis.call('TYPE', k)['ok'] ~= 'string' then
    return redis.call('HMGET', k, 'st', 'fp', 'at', 'ow', 'lu', 'ca', 'ua', 'ea', 'le', 'ff', 'lf', 'rs', 'sn'), false
  end
  local ok, r = pcall(cmsgpack.unpack, redis.call('GET', k))
  if not ok or type(r) ~= 'table' or #r ~= 13 then
    return {'?'}, true
  end
  if type(r[8]) == 'string' and string.sub(r[8], 1, 1) == '+' then
    local ca = redis.call('PEXPIRETIME', k) - tonumber(string.sub(r[8], 2))
    r[5] = ca + (tonumber(string.sub(r[5], 2)) or 0)
    r[6], r[7], r[8] = ca, ca, ca + tonumber(string.sub(r[8], 2))
  end
  return r, true
end
local function text(v)
  if type(v) == 'number' then
    return string.format('%.0f', v)
  end
  return v
end
local function pack(r)
  for _, j in ipairs({3, 5, 6, 7, 8, 10, 11}) do
    r[j] = r[j] and tonumber(r[j]) or false
  end
  return cmsgpack.pack(r)
end
local function setUntil(k, v, ea, now)
  if ea > now then
    redis.call('SET', k, v, 'PX', ea - now)
  else
    redis.call('DEL', k)
  end
end
local function put(k, r, str, now)
  if str then
    setUntil(k, pack(r), tonumber(r[8]), now)
    return
  end
  redis.call('HSET', k, 'st', r[1], 'at', r[3], 'ow', r[4], 'lu', r[5], 'ua', r[7], 'ea', r[8], 'sn', r[13] or '')
  redis.call('PEXPIREAT', k, r[8])
end
`

// luaHeld is the fence of the settling scripts, for record k: it loads r
// (and str, whether it is a string); held is true when owner holds it
// (PROCESSING under owner's token), again when this call (owner, nonce)
// already settled it and is running a second time.
const luaHeld = `local r, str = load(k)
local held = r[1] == 'PROCESSING' and r[4] == owner
local again = r[4] == owner and r[13] == nonce
`

// completeScript completes KEYS in order; for KEYS[i] ARGV holds five values
// from 5i-4: owner, nonce, TTL (ms), "1" when there is a result, the result.
// It returns 1 per completed key, 0 per refused one.
var completeScript = newScript(luaNow + luaRecord + `
local out = {}
for i, k in ipairs(KEYS) do
  local a = (i - 1) * 5
  local owner, nonce, ttl = ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
  ` + luaHeld + `
  out[i] = 0
  if again then
    out[i] = 1
  elseif held then
    -- Only a SUCCEEDED record has a result, so a held one has none.
    r[1], r[7], r[8], r[13] = 'SUCCEEDED', now, now + ttl, nonce
    r[12] = ARGV[a + 4] == '1' and ARGV[a + 5]
    setUntil(k, pack(r), now + ttl, now)
    out[i] = 1
  end
end
return out
`)

// failScript records a failed attempt of KEYS[1]; ARGV: owner, nonce, status
// (FAILED_RETRYABLE or FAILED_FINAL), error text, TTL (ms). It returns 1, or
// 0 when owner does not hold the record.
var failScript = newScript(luaNow + luaRecord + `
local k, owner, nonce, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[5])
` + luaHeld + `
if again then return 1 end
if not held then return 0 end
r[1], r[7], r[8], r[9], r[10], r[11], r[13] = ARGV[3], now, now + ttl, ARGV[4], r[10] or now, now, nonce
if ARGV[3] == 'FAILED_FINAL' then
  setUntil(k, pack(r), now + ttl, now)
  return 1
end
if str then
  put(k, r, str, now)
  return 1
end
redis.call('HSET', k, 'st', ARGV[3], 'le', ARGV[4], 'lf', now, 'ua', now, 'ea', now + ttl, 'sn', nonce)
redis.call('HSETNX', k, 'ff', now)
redis.call('PEXPIREAT', k, now + ttl)
return 1
`)

// releaseScript gives back the claim on KEYS[1] uncounted; ARGV: owner,
// nonce. It returns 1, or 0 when owner does not hold the record.
var releaseScript = newScript(luaNow + luaRecord + `
local k, owner, nonce = KEYS[1], ARGV[1], ARGV[2]
` + luaHeld + `
if again then return 1 end
if not held then return 0 end
r[1], r[3], r[5], r[7], r[13] = 'FAILED_RETRYABLE', tonumber(r[3]) - 1, now, now, nonce
put(k, r, str, now)
return 1
`)

// extendScript pushes the lease of KEYS[1] to ARGV[2] ms from now if ARGV[1]
// holds it. It returns 1, or 0 when the owner does not hold the record.
var extendScript = newScript(luaNow + luaRecord + `
local k, owner = KEYS[1], ARGV[1]
local r, str = load(k)
if r[1] ~= 'PROCESSING' or r[4] ~= owner then return 0 end
r[5], r[7] = now + tonumber(ARGV[2]), now
put(k, r, str, now)
return 1
`)

// getScript returns the record of KEYS[1] as HMGET answers recordFields,
// in either form.
var getScript = newScript(luaRecord + `
local r = load(KEYS[1])
local out = {}
for j = 1, 12 do
  out[j] = text(r[j])
end
return out
`)

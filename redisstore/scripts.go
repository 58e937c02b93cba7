package redisstore

import "github.com/redis/go-redis/v9"

// A record is one Redis hash. Its fields, in the order the scripts return
// them (recordFields) and parseRecord reads them:
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
// Times are Unix milliseconds from the server's TIME, read inside every
// script, so a worker's clock never decides a lease. The key expires at ea
// (PEXPIREAT from the same clock), so Redis itself deletes expired records;
// the scripts still treat ea <= now as absent, for a key whose expiry has
// not yet been applied.
//
// Every script checks everything before its first write, and that write is
// one HSET: a server refusing writes (MISCONF, READONLY, OOM) refuses the
// HSET and the script stops with nothing changed. User input reaches the
// scripts only as KEYS and ARGV, never as script text.
var recordFields = []string{"st", "fp", "at", "ow", "lu", "ca", "ua", "ea", "le", "ff", "lf", "rs"}

// luaNow sets now to the server's time in milliseconds.
const luaNow = `local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
`

// claimScript claims KEYS in order, as one claim after another; for KEYS[i]
// ARGV holds four values from 4i-3: fingerprint, lease (ms), TTL (ms), new
// owner token. It returns, per key, {code, previous status, record fields}:
// code 1 acquired, 0 refused (the client classifies the record), -1 the
// stored record is malformed; or {2, now} for a record it created, which the
// client builds from its request. Fields the script wrote come back as
// integers or strings, fields it read as strings, absent ones as nil.
var claimScript = redis.NewScript(luaNow + `
local out = {}
for i, k in ipairs(KEYS) do
  local a = (i - 1) * 4
  local fp, lease, ttl, owner = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4]
  local r = redis.call('HMGET', k, 'st', 'fp', 'at', 'ow', 'lu', 'ca', 'ua', 'ea', 'le', 'ff', 'lf', 'rs')
  local st, at, lu, ea = r[1], tonumber(r[3]), tonumber(r[5]), tonumber(r[8])
  -- code: 2 created, 1 taken over or held already by this very claim (sent
  -- again after a broken connection), 0 refused, -1 malformed.
  local code, prev = 0, false
  if st == false and r[2] == false then
    code = 2
  elseif at == nil or lu == nil or ea == nil then
    code = -1
  elseif ea <= now then
    redis.call('DEL', k)
    code = 2
  elseif st == 'PROCESSING' and r[4] == owner then
    code = 1
  elseif r[2] == fp and (st == 'FAILED_RETRYABLE' or (st == 'PROCESSING' and lu <= now)) then
    code, prev = 1, st
    r[1], r[3], r[4], r[5], r[7], r[8] = 'PROCESSING', at + 1, owner, now + lease, now, now + ttl
    redis.call('HSET', k, 'st', r[1], 'at', r[3], 'ow', owner, 'lu', r[5], 'ua', now, 'ea', r[8])
    redis.call('PEXPIREAT', k, now + ttl)
  end
  if code == 2 then
    redis.call('HSET', k, 'st', 'PROCESSING', 'fp', fp, 'at', 1, 'ow', owner,
      'lu', now + lease, 'ca', now, 'ua', now, 'ea', now + ttl)
    -- Last, because a TTL of zero deletes the record at once.
    redis.call('PEXPIREAT', k, now + ttl)
    out[i] = {2, now}
  else
    out[i] = {code, prev, unpack(r)}
  end
end
return out
`)

// luaHeld is the fence of the settling scripts, for record k: held is true
// when owner holds it (PROCESSING under owner's token), again when this call
// (owner, nonce) already settled it and is running a second time.
const luaHeld = `local r = redis.call('HMGET', k, 'st', 'ow', 'sn')
local held = r[1] == 'PROCESSING' and r[2] == owner
local again = r[2] == owner and r[3] == nonce
`

// completeScript completes KEYS in order; for KEYS[i] ARGV holds five values
// from 5i-4: owner, nonce, TTL (ms), "1" when there is a result, the result.
// It returns 1 per completed key, 0 per refused one.
var completeScript = redis.NewScript(luaNow + `
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
    if ARGV[a + 4] == '1' then
      redis.call('HSET', k, 'st', 'SUCCEEDED', 'ua', now, 'ea', now + ttl, 'sn', nonce, 'rs', ARGV[a + 5])
    else
      redis.call('HSET', k, 'st', 'SUCCEEDED', 'ua', now, 'ea', now + ttl, 'sn', nonce)
    end
    redis.call('PEXPIREAT', k, now + ttl)
    out[i] = 1
  end
end
return out
`)

// failScript records a failed attempt of KEYS[1]; ARGV: owner, nonce, status
// (FAILED_RETRYABLE or FAILED_FINAL), error text, TTL (ms). It returns 1, or
// 0 when owner does not hold the record.
var failScript = redis.NewScript(luaNow + `
local k, owner, nonce, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[5])
` + luaHeld + `
if again then return 1 end
if not held then return 0 end
redis.call('HSET', k, 'st', ARGV[3], 'le', ARGV[4], 'lf', now, 'ua', now, 'ea', now + ttl, 'sn', nonce)
redis.call('HSETNX', k, 'ff', now)
redis.call('PEXPIREAT', k, now + ttl)
return 1
`)

// releaseScript gives back the claim on KEYS[1] uncounted; ARGV: owner,
// nonce. It returns 1, or 0 when owner does not hold the record.
var releaseScript = redis.NewScript(luaNow + `
local k, owner, nonce = KEYS[1], ARGV[1], ARGV[2]
` + luaHeld + `
if again then return 1 end
if not held then return 0 end
redis.call('HSET', k, 'st', 'FAILED_RETRYABLE', 'at', tonumber(redis.call('HGET', k, 'at')) - 1,
  'lu', now, 'ua', now, 'sn', nonce)
return 1
`)

// extendScript pushes the lease of KEYS[1] to ARGV[2] ms from now if ARGV[1]
// holds it. It returns 1, or 0 when the owner does not hold the record.
var extendScript = redis.NewScript(luaNow + `
local r = redis.call('HMGET', KEYS[1], 'st', 'ow')
if r[1] ~= 'PROCESSING' or r[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lu', now + tonumber(ARGV[2]), 'ua', now)
return 1
`)

-- control.lua: one change of the runtime state (package control): the
-- overrides and modes an operator sets, shared by every instance.
--
-- KEYS[1] is the state, a hash of field -> JSON; KEYS[2] its version, a
-- counter every change increments, which instances poll to learn that the
-- state changed. Both keys share a hash tag, so one script changes both on
-- a Cluster too.
--
-- ARGV[1] is the field, ARGV[2] the operation: 'set' (to ARGV[3]), 'del',
-- or 'prune' (delete the field only if it still holds ARGV[3]: an expired
-- entry, unless someone replaced it meanwhile). Returns the field's old
-- value, or false when it had none (or, for prune, was not deleted).
local old = redis.call('HGET', KEYS[1], ARGV[1])
local op = ARGV[2]
if op == 'set' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
elseif op == 'del' then
  if not old then return false end
  redis.call('HDEL', KEYS[1], ARGV[1])
elseif op == 'prune' then
  if old ~= ARGV[3] then return false end
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  return redis.error_reply('control.lua: unknown operation ' .. tostring(op))
end
redis.call('INCR', KEYS[2])
return old

// Produce DAG-CBOR test vectors with the IPLD reference codec.
// Usage: node generate.mjs INPUT.json OUTPUT.json
import { readFileSync, writeFileSync } from 'node:fs'
import * as dagCbor from '@ipld/dag-cbor'
import * as cborg from 'cborg'
import { CID } from 'multiformats/cid'
import { base64 } from 'multiformats/bases/base64'
import { base16 } from 'multiformats/bases/base16'
import { sha256 } from 'multiformats/hashes/sha2'

// Marks a number that must be encoded as a CBOR float64 even when integral.
class Float64 {
  constructor (value) {
    if (!Number.isFinite(value)) throw new Error(`invalid /float value: ${value}`)
    this.value = value
  }
}

// The reference codec's own options, plus one hook: cborg dispatches class
// instances under the type name 'Object', so Float64 markers are intercepted
// there and everything else goes to dag-cbor's own Object (CID) encoder.
// dag-cbor sets float64: true, so a Type.float token is always 9 bytes (0xfb).
const encodeOptions = {
  ...dagCbor.encodeOptions,
  typeEncoders: {
    ...dagCbor.encodeOptions.typeEncoders,
    Object: (obj, ...rest) => obj instanceof Float64
      ? [new cborg.Token(cborg.Type.float, obj.value)]
      : dagCbor.encodeOptions.typeEncoders.Object(obj, ...rest)
  }
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v)
const onlyKey = (v, key) => isObject(v) && Object.keys(v).length === 1 && key in v

// Convert the JSON special forms; ctx.integralFloat records whether a
// Float64 marker holds an integral value (these cannot round-trip in JS).
function convert (v, ctx) {
  if (Array.isArray(v)) return v.map((x) => convert(x, ctx))
  if (typeof v === 'number' && Number.isInteger(v) && !Number.isSafeInteger(v)) {
    throw new Error(`integer outside the safe range: ${v}`)
  }
  if (!isObject(v)) return v
  if (onlyKey(v, '/') && typeof v['/'] === 'string') return CID.parse(v['/'])
  if (onlyKey(v, '/') && onlyKey(v['/'], 'bytes') && typeof v['/'].bytes === 'string') {
    return base64.baseDecode(v['/'].bytes)
  }
  if (onlyKey(v, '/float')) {
    if (Number.isInteger(v['/float'])) ctx.integralFloat = true
    return new Float64(v['/float'])
  }
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, convert(x, ctx)]))
}

function encode (name, obj) {
  const ctx = { integralFloat: false }
  const bytes = cborg.encode(convert(obj, ctx), encodeOptions)
  const decoded = dagCbor.decode(bytes)
  if (!ctx.integralFloat) {
    const again = base16.baseEncode(dagCbor.encode(decoded))
    if (again !== base16.baseEncode(bytes)) throw new Error(`${name}: re-encoding differs`)
  }
  return bytes
}

const [input, output] = process.argv.slice(2)
if (!input || !output) {
  console.error('usage: node generate.mjs INPUT.json OUTPUT.json')
  process.exit(2)
}

const vectors = []
for (const { name, unsigned, signed } of JSON.parse(readFileSync(input, 'utf8'))) {
  const unsignedBytes = encode(`${name} (unsigned)`, unsigned)
  const signedBytes = encode(`${name} (signed)`, signed)
  vectors.push({
    name,
    unsigned_hex: base16.baseEncode(unsignedBytes),
    signed_hex: base16.baseEncode(signedBytes),
    cid: CID.createV1(dagCbor.code, await sha256.digest(signedBytes)).toString()
  })
}
writeFileSync(output, JSON.stringify(vectors, null, 2) + '\n')
console.log(`wrote ${vectors.length} vectors to ${output}`)

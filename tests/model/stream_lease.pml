/*
 * stream_lease.pml -- SPIN model of the stream-slot lease lifecycle of
 * fork-overlay/aten/src/ATen/mps/MPSStreamPool.{h,cpp} (StreamSlotPool):
 * Note [MPS stream pool], Note [MPS current stream]. Run it with
 * tests/model/run_stream_lease.sh.
 *
 * Scope: NS worker slots (slot 0 is the default stream) and NT = 4 non-main
 * threads: NS = 2 (default; two threads can wait at once, so notifyOne's
 * choice and barging matter) or NS = 3 (-DNS=3; one waiter at a time, three
 * slots in the free list). The exhaustion policy
 * (MPS_STREAM_POOL_WAIT_TIMEOUT_MS unset / 0 / -1 / N>0) is chosen by init,
 * any of them, or fixed with -DPOLICY=0..3; either way it holds for the
 * whole run, as the C++ reads it once per process. A call is
 * currentStream() (leases on first use, and again after a release),
 * releaseCurrentThreadSlot(), and for thread 0 also set_stream(target) (a
 * bare exchangeCurrentIndex(target); torch.mps.set_stream, and
 * torch.mps.stream(...), which is set_stream on entry and on exit) or a
 * CurrentStreamGuard scope onto any slot (0..NS, its own lease included).
 * A scope is the constructor's exchangeCurrentIndex(target), the scope's
 * work -- at most one set_stream() per run (INNER), then possibly
 * releaseCurrentThreadSlot(), then possibly a currentStream() -- and the
 * destructor's exchangeCurrentIndex(previous_); c10 stream guards
 * (MPSGuardImpl::exchangeStream) make the same two calls. Thread 0 makes
 * up to OPS0 = 3 calls and may fork() between any two, thread 1 up to
 * OPS1 = 3 (lease, release, lease again), threads 2 and 3 OPS2 = 1 (they
 * take a lease and hold it); thread 3 may then keep using its stream
 * forever. A call is offered only where it can change the state (see
 * MAY_CALL). A thread may stop between any two calls; ~ThreadBindings then
 * returns its lease.
 *
 * The binding (Binding::current, leased, displaced) follows these rules
 * (commit 8711536, "leases go back only outside stream contexts"):
 * - currentIndexSlow() on an unbound thread calls acquireWorkerSlot() and
 *   binds the result: a lease, or under kShare with no free slot a shared
 *   round-robin slot (leased stays -1).
 * - exchangeCurrentIndex(index): previous = currentIndex(query = true)
 *   (Note [MPS stream queries]): an unbound thread takes a free slot as a
 *   lease, or else a shared round-robin slot, provisional when the policy
 *   is not kShare, whatever the policy says; an op (currentStream()) on a
 *   provisional binding with no displacement open binds again with the
 *   policy, and neither the query nor an exchange leaving no displacement
 *   puts a provisional slot in the cache. Then if displaced is
 *   non-empty and displaced.back() == index it pops (the exchange undoes
 *   the last unmatched one), else it pushes previous; current = index, the
 *   cache follows; returns previous. Only thread 0 exchanges, so only it
 *   has a stack (disp[], depth dn, at most DMAX: deepStack).
 * - releaseCurrentThreadSlot(): no lease: returns, changing nothing (not
 *   offered). displaced non-empty: the TORCH_CHECK throws, changing
 *   nothing. Otherwise leased = current = -1, the cache is cleared, and
 *   returnSlot(leased) runs the hook, pushes, notifies.
 *
 * What the rule cannot tell apart, and the default run leaves out: the pool
 * sees only exchange calls, so "set_stream(b) after set_stream(a)" and
 * "a guard onto b inside set_stream(a)" are the same calls. By default no
 * guard constructor, and no set_stream() inside a scope, exchanges back to
 * displaced.back() (GUARD_OK), i.e. no exchange inside or into a scope pops
 * an entry the scope did not push. -DUNDO_ACROSS_GUARD lets them: such a
 * pop empties the stack inside the scope, the release inside it goes
 * through, and the scope's destructor then leases (leaseInRestore), e.g.
 * { guard(own); set_stream(own); release(); } (the set_stream pops the
 * guard's entry), or set_stream(b); { guard(own); release(); } (the guard
 * pops the set_stream's): the restore runs currentIndex() on an unbound
 * thread, which throws or blocks in a destructor when the pool is
 * exhausted. -DCHECK_REFUSALS asserts that
 * a release at top level (no scope open) on the thread's own lease is not
 * refused (spuriousRefusal); it is, after set_stream() to the current
 * stream, or set_stream() inside a scope: both push entries nothing pops.
 * run_stream_lease.sh --gaps shows both.
 *
 * The child of fork(): one thread, a copy of the forking one, sharing
 * nothing with the parent afterwards, so it is evaluated within the fork()
 * step from the copied state. onForkChild() bumped
 * fork_generation_counter_ and cleared tls_slot_cache, so its calls miss
 * currentIndex()'s fast path and throw at checkNotForked(), changing
 * nothing; it ends with _exit() (no thread_local destructors)
 * or with exit(), whose ~ThreadBindings skips the copied binding because
 * the binding's fork generation is the parent's: no registry lock, no
 * release hook, no returnSlot in the child.
 *
 * Granularity: one Promela step per step of the C++ that another thread
 * can observe. A mutex section whose data only lock holders touch is one
 * step from lock to unlock (lock moves right, unlock moves left: reduction
 * in Lipton's sense), together with the thread's own thread_local writes
 * (binding, cache) next to it, which no other thread can see; so mu_ is
 * never seen held. An exchange's bookkeeping after currentIndex() touches
 * only thread_locals: one step (the target is chosen in it). A guard's
 * destructor is one step: it must not reach acquireWorkerSlot anyway.
 * registry().mu is held across the returnSlot of a thread exit, the notify
 * included, so fork() can copy it held. slot_freed_ (a
 * condition_variable_any) is a wait set: wait() drops mu_ and joins the set
 * in one step (the cv's internal mutex spans both, so no wakeup is lost
 * there); notifyOne(), a separate step after returnSlot drops mu_, wakes one
 * arbitrary member or nobody; a spurious wakeup (at most SPURIOUS per run)
 * or a waitFor() deadline (any time while waiting) may also end the wait;
 * the woken thread then takes mu_ and re-checks the predicate in a later
 * step, so other threads can barge in between.
 *
 * Checks: `monitor` asserts the invariants INV in every state (on failure
 * it names the broken one):
 *   badSlots    no slot is leased twice, and a free slot is nobody's lease
 *   badCount    free_slots_'s popcount matches the free set and the leases
 *   badCache    tls_slot_cache never disagrees with the binding
 *   badBinding  with no displacement open a lease holder's current slot is
 *               its lease; with one open the thread is bound (current >= 0)
 *   badForeign  with no displacement open a thread is bound to no worker
 *               slot it does not lease, except the one kShare (or a query)
 *               handed it
 *   badProvisional  a provisional binding holds no lease, and with no
 *               displacement open the cache does not hold it
 * Asserts in the threads: what currentStream() returns; that an exchange
 * makes its target current (guardMissesTarget); that an exchange's query
 * neither waits nor throws (queryBlocks); that a guard's destructor
 * never enters acquireWorkerSlot (leaseInRestore: a destructor can neither
 * lease, nor block, nor throw); that the stack stays within DMAX
 * (deepStack); that the fork child runs no release hook (hookInChild) and
 * blocks on no lock copied held (childBlocks). pan -DSAFETY also reports
 * invalid end states (deadlock, a waiter left blocked). `ltl live`: every
 * thread that blocks in acquireWorkerSlot is eventually served or times
 * out, under weak fairness (pan -a -f): a thread that stays runnable is
 * eventually scheduled, as an OS scheduler does; nothing stronger is
 * assumed (std::mutex and condition variables are not FIFO: a woken waiter
 * has no priority over a thread that takes mu_ first).
 *
 * Abstractions: one pool (pool ids, the registry map, pool destruction and
 * the per-pool binding list are not modelled); no main thread (it never
 * leases); stream creation (create_mu_, streams_), getStreamFromPool() and
 * nested guards are left out (a set_stream() inside a scope stands for the
 * inner exchange); round_robin_ counts mod NS; free_slots_ is a set
 * (a bit mask: the lowest set bit is leased first); the release hook is an
 * assertion point; a pool made in the fork child is not modelled.
 *
 * Switches (-D to spin -a):
 *   POLICY=p          0 share, 1 throw, 2 wait (-1), 3 wait with timeout
 *                     (default: init picks one)
 *   POLICY_FROM=p     without POLICY, init picks one of p..3 (default 0)
 *   SPURIOUS=n        spurious-wakeup budget (default 1; 0 for liveness)
 *   NS=2|3            worker slots, see Scope
 *   OPS0/OPS1/OPS2=n  calls per thread, see Scope
 *   INNER=n           set_stream() calls inside scopes per run (default 1)
 *   DMAX=n            displaced stack bound (default 5: 3 calls of thread
 *                     0 with one inner set_stream() reach it)
 *   NOFORK            no fork() (liveness runs: the child shares no state
 *                     with the parent, so it cannot affect parent waiters)
 *   CHURN             threads call forever; the waiter liveness then fails
 *                     even under weak fairness: a woken waiter can lose
 *                     mu_ and the slot to a barging thread every time
 *   UNDO_ACROSS_GUARD, CHECK_REFUSALS  see "What the rule cannot tell
 *                     apart" above
 * Switches that put back earlier code, each a bug SPIN finds:
 *   OLD_CHILD_EXIT    ~ThreadBindings has no fork-generation test: a child
 *                     ending with exit() returns the copied lease to the
 *                     parent's pool (hookInChild)
 *   CHILD_HOOK_OK     with OLD_CHILD_EXIT, no hook assertion, so SPIN goes
 *                     on to the registry lock copied held (childBlocks)
 *   OLD_RELEASE_IN_GUARD  releaseCurrentThreadSlot() without its check: a
 *                     release inside a scope goes through, and the scope's
 *                     destructor leases (leaseInRestore)
 *   OLD_RELEASED_RULE the rule before 8711536: Binding::released instead
 *                     of the stack (kept as ghost state, for the
 *                     invariants), the release check current == leased
 *                     (so a scope onto the thread's own lease lets it
 *                     through), previous = (current < 0 && released >= 0) ?
 *                     released : currentIndex(), and an exchange to
 *                     `released` by a thread without a lease unbinds it;
 *                     so set_stream() or a scope's constructor onto the
 *                     slot just released leaves the thread unbound instead
 *                     of on its target (guardMissesTarget): use, release,
 *                     set_stream(that slot)
 *   OLD_QUERY_LEASES  an exchange's query binds with the policy, as an op
 *                     does: a guard's constructor on an unbound thread
 *                     throws or waits when the pool is exhausted
 *                     (queryBlocks)
 */

#ifndef NS
#define NS 2 /* worker slots: 2 or 3 (the macros below spell them out) */
#endif
#define NT 4 /* threads (the macros below spell out threads 0..3) */
#ifndef OPS0
#define OPS0 3 /* calls made by thread 0 */
#endif
#ifndef OPS1
#define OPS1 3 /* calls made by thread 1 (use, release, use again) */
#endif
#ifndef OPS2
#define OPS2 1 /* calls made by threads 2 and 3 (use: they hold a lease) */
#endif
#ifndef SPURIOUS
#define SPURIOUS 1
#endif
#ifndef INNER
#define INNER 1
#endif
#ifndef DMAX
#define DMAX 5
#endif

#define SHARE  0 /* unset: ExhaustionPolicy::kShare */
#define THROW  1 /* "0":   kThrow */
#define WAIT   2 /* "-1":  kWait */
#define WAITTO 3 /* "N":   kWaitTimeout */
#ifndef POLICY_FROM
#define POLICY_FROM SHARE
#endif

/* ---- StreamSlotPool, shared ------------------------------------------ */
byte mu;              /* mu_: 0 free, else owner thread + 1 */
/* StreamSlotPool(): free_slots_ = bits 1..31: all worker slots free */
bool isfree[NS + 1] = true; /* free_slots_ as a set (isfree[0] unused):
                         acquireWorkerSlot takes its lowest set bit,
                         the lowest free index */
byte nfree = NS;      /* free_slots_'s popcount */
bool inwait[NT];      /* slot_freed_'s wait set */
#ifdef POLICY
#define POL POLICY
#else
byte policy;          /* options_.exhaustion.policy, chosen by init */
#define POL policy
#endif
byte rr;              /* round_robin_, mod NS */
byte regmu;           /* registry().mu: 0 free, else owner + 1 */
byte spur = SPURIOUS; /* spurious wakeups left */

/* ---- thread_locals, one per thread ----------------------------------- */
short cur[NT] = -1;   /* tls_bindings: Binding::current, -1 none */
short leased[NT] = -1;/* tls_bindings: Binding::leased,  -1 none */
byte disp[DMAX];      /* thread 0's Binding::displaced, innermost last;
                         entries at dn and above are kept 0 */
byte dn;              /* displaced.size() */
#ifdef OLD_RELEASED_RULE
short released[NT] = -1; /* the old Binding::released, -1 none */
#endif
short cache[NT] = -1; /* tls_slot_cache.current; a single pool, so the
                         pool_id compare is folded in: >= 0 means a hit */
bool prov[NT];        /* tls_bindings: Binding::provisional */

/* ---- ghost state, for the properties --------------------------------- */
short shared[NT] = -1;/* the slot kShare bound this thread to, -1 none */
bool waiting[NT];     /* blocked in acquireWorkerSlot (slot_freed_.wait*) */
byte inner = INNER;   /* set_stream() calls inside scopes left */
/* set only in the step that fails, to name what broke */
bool badSlots, badCount, badCache, badBinding, badForeign, badProvisional;
bool leaseInRestore, guardMissesTarget, deepStack, hookInChild, childBlocks;
bool queryBlocks;
bool spuriousRefusal;

/* thread t has an open displacement (only thread 0 exchanges) */
#define DISPLACED(t) (t == 0 && dn > 0)
/* an exchange to slot s would pop */
#define POPS(s) (dn > 0 && disp[dn - 1] == s)

/* Safety invariants */
#define OWN(s) ((leased[0] == s) + (leased[1] == s) + (leased[2] == s) + \
                (leased[3] == s))
/* at most one lease per slot; a free slot is nobody's lease */
#define SLOT_OK(s) (OWN(s) <= 1 && !(isfree[s] && OWN(s) > 0))
/* the TLS cache never disagrees with the binding it caches */
#define CACHE_OK(t) (cache[t] < 0 || cache[t] == cur[t])
/* with no displacement open a lease holder's current stream is its lease;
   with one open the thread is bound (not under the old rule, whose
   release inside a scope on the own lease left it unbound on purpose) */
#ifdef OLD_RELEASED_RULE
#define BOUND_OK(t) true
#else
#define BOUND_OK(t) (!DISPLACED(t) || cur[t] >= 0)
#endif
#define BIND_OK(t) ((leased[t] < 0 || DISPLACED(t) || cur[t] == leased[t]) \
                    && BOUND_OK(t))
/* with no displacement open a thread is bound only to its lease, to the
   slot kShare handed it, or to the default stream */
#define FOREIGN_OK(t) (DISPLACED(t) || cur[t] <= 0 || cur[t] == leased[t] || \
                       cur[t] == shared[t])
#if NS == 2
#define SLOTS_OK (SLOT_OK(1) && SLOT_OK(2))
#define NFREE (isfree[1] + isfree[2])
#define NOWNED (OWN(1) + OWN(2))
#else
#define SLOTS_OK (SLOT_OK(1) && SLOT_OK(2) && SLOT_OK(3))
#define NFREE (isfree[1] + isfree[2] + isfree[3])
#define NOWNED (OWN(1) + OWN(2) + OWN(3))
#endif
#define COUNT_OK (nfree == NFREE && nfree + NOWNED == NS)
#define CACHES_OK (CACHE_OK(0) && CACHE_OK(1) && CACHE_OK(2) && CACHE_OK(3))
#define BINDS_OK (BIND_OK(0) && BIND_OK(1) && BIND_OK(2) && BIND_OK(3))
#define FOREIGNS_OK (FOREIGN_OK(0) && FOREIGN_OK(1) && FOREIGN_OK(2) && \
                     FOREIGN_OK(3))
/* a provisional binding holds no lease, and with no displacement open the
   cache does not hold it, so the thread's next op settles it */
#define PROV_OK(t) (!prov[t] || (leased[t] < 0 && cur[t] >= 1 && \
                                 (DISPLACED(t) || cache[t] < 0)))
#define PROVS_OK (PROV_OK(0) && PROV_OK(1) && PROV_OK(2) && PROV_OK(3))
#define INV (SLOTS_OK && COUNT_OK && CACHES_OK && BINDS_OK && FOREIGNS_OK && \
             PROVS_OK)

/* asserts INV, naming the part that fails */
inline check_inv() {
  badSlots = !SLOTS_OK; badCount = !COUNT_OK; badCache = !CACHES_OK;
  badBinding = !BINDS_OK; badForeign = !FOREIGNS_OK;
  badProvisional = !PROVS_OK;
  assert(!badSlots); assert(!badCount); assert(!badCache);
  assert(!badBinding); assert(!badForeign); assert(!badProvisional)
}

/* releaseCurrentThreadSlot's TORCH_CHECK fails (a thread holding a lease):
   it throws, changing nothing */
#if defined(OLD_RELEASE_IN_GUARD)
#define RELEASE_REFUSED false
#elif defined(OLD_RELEASED_RULE)
#define RELEASE_REFUSED (cur[me] != leased[me])
#else
#define RELEASE_REFUSED DISPLACED(me) /* TORCH_CHECK(b.displaced.empty()) */
#endif

/* the old rule: exchangeCurrentIndex's previous is the released slot,
   without a call to currentIndex() */
#ifdef OLD_RELEASED_RULE
#define PREV_IS_RELEASED (cur[me] < 0 && released[me] >= 0)
#define SET_RELEASED(s) released[me] = s
#else
#define SET_RELEASED(s) skip
#endif

/* Which calls a thread is offered. A call that would change nothing but
   the call count is not: the states after it are those before it with one
   call fewer left, so it adds no behaviour. So currentStream() is offered
   only where it leaves the fast path (what the fast path returns, cache ==
   current, the invariants cover), and releaseCurrentThreadSlot() only with
   a lease and where it is not refused (CHECK_REFUSALS: also where it is,
   to check why). */
#define MAY_USE (cache[me] < 0)
/* callers of currentIndex(), for after_index() */
#define K_USE   1 /* currentStream() */
#define K_SET   2 /* set_stream(target), no scope open */
#define K_INNER 3 /* set_stream(target) inside a scope */
#define K_GUARD 4 /* a guard's constructor */
#ifdef CHECK_REFUSALS
#define MAY_RELEASE (leased[me] >= 0)
#else
#define MAY_RELEASE (leased[me] >= 0 && !(RELEASE_REFUSED))
#endif
#define MAY_EXCHANGE (me == 0)
#define MAY_CALL (MAY_USE || MAY_RELEASE || MAY_EXCHANGE)
/* the slots an exchange may be given: set_stream() at top level any; a
   guard's constructor, and a set_stream() inside a scope, by default none
   that pops (see "What the rule cannot tell apart") */
#define ANY_OK(t) true
#ifdef UNDO_ACROSS_GUARD
#define GUARD_OK(t) true
#else
#define GUARD_OK(t) (!POPS(t))
#endif
#if NS == 2
#define CHOOSE(v, OK) if :: OK(1) -> v = 1 :: OK(2) -> v = 2 fi
#else
#define CHOOSE(v, OK) \
  if :: OK(1) -> v = 1 :: OK(2) -> v = 2 :: OK(3) -> v = 3 fi
#endif

/* ~ThreadBindings in the fork child: `continue` for this binding. The
   binding was made in the parent (generation 0); onForkChild() made the
   counter 1. */
#define BINDING_GEN 0
#define CHILD_GEN 1
#ifdef OLD_CHILD_EXIT
#define CHILD_SKIPS(lease) (lease < 0)
#else
#define CHILD_SKIPS(lease) (lease < 0 || BINDING_GEN != CHILD_GEN)
#endif

/* acquireWorkerSlot: slot = ctz(free_slots_); clear that bit;
   then currentIndexSlow: b.current = b.leased = slot (leased = true);
   tls_slot_cache = {id_, slot}. One step with the lock (see Granularity). */
#define POP_LOWEST_AND_BIND(out) \
  assert(nfree > 0); \
  out = 1; \
  do :: isfree[out] -> break :: else -> out++ od; \
  isfree[out] = false; nfree--; \
  assert(OWN(out) == 0); leased[me] = out; cur[me] = out; cache[me] = out; \
  SET_RELEASED(-1); shared[me] = -1; prov[me] = false

/* CondVar::notifyOne -> condition_variable_any::notify_one (used within
   an atomic step) */
inline notify_one() {
  if
  :: inwait[0] -> inwait[0] = false
  :: inwait[1] -> inwait[1] = false
  :: inwait[2] -> inwait[2] = false
  :: inwait[3] -> inwait[3] = false
  :: else -> skip /* nobody waits: lost, harmless, since every waiter
                     checks the predicate under mu_ before it waits */
  fi
}

/* StreamSlotPool::currentIndex(query): out = index, or threw = true (the
   exception propagates, binding and cache unchanged); `may` is a further
   guard on every branch; the caller's next step, after_index(kind), runs in
   the same step as the one that returns (see Granularity). An op
   (currentStream(), kind K_USE) binds with the policy: the slow path that
   leases is split by whether acquireWorkerSlot waits. An exchange's
   previous is a query (Note [MPS stream queries]): acquireWorkerSlot with
   kShare's config, marked provisional when the policy is not kShare and it
   got no lease; an op with no displacement open settles such a binding
   with the policy. -DOLD_QUERY_LEASES: queries bind with the policy too,
   the rule before Note [MPS stream queries]. */
#ifdef OLD_QUERY_LEASES
#define WITH_POLICY(kind) true
#else
#define WITH_POLICY(kind) (kind == K_USE)
#endif
#define SETTLE (prov[me] && !DISPLACED(me))
#define SLOW_LEASE (cache[me] < 0 && (cur[me] < 0 || SETTLE) && mu == 0)
#define MUST_WAIT (nfree == 0 && (POL == WAIT || POL == WAITTO))
inline current_index(out, may, kind) {
  if
  :: atomic { may && cache[me] >= 0 -> out = cache[me]; threw = false;
       after_index(kind, out) }
     /* currentIndex: fast path, cached.pool_id == id_ && current >= 0 */
  :: atomic { may && cache[me] < 0 && cur[me] >= 0 &&
              !(WITH_POLICY(kind) && SETTLE) ->
       if :: !SETTLE -> cache[me] = cur[me] :: else -> skip fi;
       out = cur[me]; threw = false;
       after_index(kind, out) }
     /* currentIndexSlow: checkNotForked() passes in the parent; b.current
        >= 0, nothing to settle: if (!b.provisional || displaced) then
        tls_slot_cache = {id_, b.current}; return b.current */
  :: atomic { may && !WITH_POLICY(kind) && cache[me] < 0 && cur[me] < 0 &&
              mu == 0 ->
       /* currentIndexSlow(true): acquireWorkerSlot(ExhaustionConfig{}):
          a free slot, or else {nextPoolIndex(), leased = false} */
       mu = me + 1; threw = false;
       if
       :: nfree > 0 -> POP_LOWEST_AND_BIND(out)
       :: else ->
         out = rr + 1; rr = (rr + 1) % NS; cur[me] = out; shared[me] = out;
         SET_RELEASED(-1); prov[me] = (POL != SHARE);
         if :: prov[me] -> skip :: else -> cache[me] = out fi
       fi;
       assert(mu == me + 1); mu = 0;
       after_index(kind, out)
     }
  :: atomic { may && WITH_POLICY(kind) && SLOW_LEASE && !MUST_WAIT ->
       /* currentIndexSlow: b.current < 0, not the main thread ->
          acquireWorkerSlot: MutexLock lock(mu_); if (!has_free()) */
       mu = me + 1; threw = false;
       if
       :: nfree > 0 -> POP_LOWEST_AND_BIND(out)
       :: else ->
         if
         :: POL == SHARE ->
           /* case kShare: {nextPoolIndex(), leased = false};
              nextPoolIndex: round_robin_.fetch_add(1); b.current = index,
              b.leased = -1, tls_slot_cache = {id_, index} */
           out = rr + 1; rr = (rr + 1) % NS; cur[me] = out; cache[me] = out;
           SET_RELEASED(-1); shared[me] = out; prov[me] = false
         :: POL == THROW -> threw = true /* case kThrow: TORCH_CHECK */
         fi
       fi;
       assert(mu == me + 1); mu = 0; /* ~MutexLock, on the throw path too */
       after_index(kind, out)
     }
  :: atomic { may && WITH_POLICY(kind) && SLOW_LEASE && MUST_WAIT ->
       threw = false;
       queryBlocks = (kind != K_USE); assert(!queryBlocks);
       /* MutexLock lock(mu_); !has_free():
          case kWait:        slot_freed_.wait(mu_, has_free)
          case kWaitTimeout: slot_freed_.waitFor(mu_, timeout, has_free):
          while (!pred()) { cv_.wait(mu) / if (cv_.wait_until(mu, deadline)
          == timeout) return pred(); }   (pred is false): cv_.wait unlocks
          mu_ and joins the wait set in one step */
       waiting[me] = true; inwait[me] = true }
     do
     :: atomic { !inwait[me] && mu == 0 -> mu = me + 1;
          /* woken (notifyOne, or spurious, or the deadline, below): the
             wait returns with mu_ held again; then pred() */
          if
          :: nfree > 0 -> POP_LOWEST_AND_BIND(out); waiting[me] = false
          :: nfree == 0 && timedOut -> /* return pred() == false: the
               TORCH_CHECK on waitFor's result throws */
            threw = true; waiting[me] = false
          :: else -> inwait[me] = true /* while (!pred()): wait again */
          fi;
          assert(mu == me + 1); mu = 0; /* ~MutexLock */
          if
          :: !waiting[me] -> timedOut = false; after_index(kind, out); break
          :: else -> skip
          fi }
     :: atomic { inwait[me] && spur > 0 -> inwait[me] = false; spur-- }
        /* spurious wakeup */
     :: atomic { POL == WAITTO && inwait[me] ->
          inwait[me] = false; timedOut = true }
        /* wait_until: the deadline passed, cv_status::timeout */
     od
  fi
}

/* StreamSlotPool::exchangeCurrentIndex(index), its first part:
   checkNotForked(); validateIndex(); previous = currentIndex() (the old
   rule: b.current < 0 && b.released >= 0 ? b.released : currentIndex());
   `may` guards every branch */
inline exchange_previous(out, may, kind) {
#ifdef OLD_RELEASED_RULE
  if
  :: atomic { may && PREV_IS_RELEASED -> out = released[me]; threw = false;
       after_index(kind, out) }
  :: current_index(out, may && !(PREV_IS_RELEASED), kind)
  fi
#else
  current_index(out, may, kind)
#endif
}

/* The same, called by a guard's destructor (~CurrentStreamGuard, or a c10
   guard's restore; used within an atomic step). It must not enter
   acquireWorkerSlot (leaseInRestore): a destructor can neither lease,
   block nor throw. */
inline restore_previous(out) {
  if
#ifdef OLD_RELEASED_RULE
  :: PREV_IS_RELEASED -> out = released[me]
  :: else ->
#else
  :: true ->
#endif
    if
    :: cache[me] >= 0 -> out = cache[me] /* currentIndex: fast path */
    :: cache[me] < 0 && cur[me] >= 0 -> cache[me] = cur[me]; out = cur[me]
       /* currentIndexSlow: b.current >= 0 */
    :: cache[me] < 0 && cur[me] < 0 ->
       /* currentIndexSlow: b.current < 0 -> acquireWorkerSlot */
       leaseInRestore = true; assert(!leaseInRestore)
    fi
  fi
}

/* StreamSlotPool::exchangeCurrentIndex(index), its second part (used within
   an atomic step): if (!b.displaced.empty() && b.displaced.back() == index)
   b.displaced.pop_back(); else b.displaced.push_back(previous);
   b.current = index; tls_slot_cache = {id_, index}; return previous.
   The old rule kept no stack (here it is ghost state): if (b.leased < 0 &&
   index == b.released) { b.released = -1; b.current = -1;
   tls_slot_cache = {0, -1}; } else { b.current = index; ... } */
inline exchange_set(index, previous, restore) {
  if
  :: POPS(index) -> dn--; disp[dn] = 0
  :: else ->
     deepStack = (dn >= DMAX); assert(!deepStack);
     disp[dn] = previous; dn++
  fi;
#ifdef OLD_RELEASED_RULE
  if
  :: leased[me] < 0 && index == released[me] ->
     released[me] = -1; cur[me] = -1; cache[me] = -1
  :: else -> cur[me] = index; cache[me] = index
  fi;
#else
  cur[me] = index;
  if :: prov[me] && dn == 0 -> cache[me] = -1 :: else -> cache[me] = index fi;
#endif
  /* the caller (set_stream, a scope's constructor) works on index from
     here; a restore is judged by the invariants instead (the old rule
     unbinds there on purpose) */
  guardMissesTarget = (!restore && cur[me] != index);
  assert(!guardMissesTarget)
}

/* a guard's destructor: exchangeCurrentIndex(previous_), one step (it
   touches only this thread's binding and cache) */
#define DTOR \
  restore_previous(idx); exchange_set(prev, idx, true); idx = 0; prev = 0

/* StreamSlotPool::returnSlot(s), after the caller took s from its binding
   and ran release_hook_(s) -> onLeaseReleased:
   { MutexLock lock(mu_); free_slots_ |= uint64_t{1} << index; }
   and then, after the lock is dropped, slot_freed_.notifyOne() */
#define PUSH(s) \
  assert(mu == 0 && !isfree[s]); isfree[s] = true; nfree++

/* release_hook_ runs before the slot is offered to other threads */
#define HOOK_CHECK(s) assert(s >= 1 && s <= NS && !isfree[s] && OWN(s) == 0)

/* StreamSlotPool::releaseCurrentThreadSlot: checkNotForked() passes;
   b = tls_bindings.find(*this); if (b.leased < 0) return (not offered);
   `may` guards every branch, `top`: no scope is open */
inline release_current_thread_slot(may, top) {
  if
  :: atomic { may && leased[me] >= 0 && RELEASE_REFUSED ->
       /* the TORCH_CHECK throws: binding, cache and pool unchanged */
#ifdef CHECK_REFUSALS
       /* refused outside every scope, on the thread's own lease */
       spuriousRefusal = (top && cur[me] == leased[me]);
       assert(!spuriousRefusal)
#else
       skip
#endif
     }
  :: atomic { may && leased[me] >= 0 && !(RELEASE_REFUSED) ->
       /* leased = b.leased; b.leased = -1; b.current = -1;
          tls_slot_cache = {0, -1}; returnSlot(leased): release_hook_,
          push */
       ret = leased[me];
       SET_RELEASED(ret);
       leased[me] = -1; cur[me] = -1; cache[me] = -1;
       HOOK_CHECK(ret); PUSH(ret) }
     atomic { notify_one(); ret = 0 } /* returnSlot: notifyOne() */
  fi
}

/* What a caller of currentStream() works on */
inline check_use(i) {
  assert(i >= 0 && i <= NS);
  /* under throw/wait policies a worker only ever runs on its own lease
     (with no displacement open); under share it runs on its lease if it
     holds one */
  assert(DISPLACED(me) || i == leased[me] ||
         (POL == SHARE && leased[me] < 0))
}

/* StreamPool::currentStream(): slots_.currentIndex() */
inline use_current_stream() {
  current_index(idx, MAY_USE, K_USE)
}

/* what follows currentIndex() in its caller, in the same step: out is its
   result, unless threw */
inline after_index(kind, out) {
  if
  :: kind == K_USE -> /* currentStream() works on out */
     if :: !threw -> check_use(out) :: else -> skip fi;
     out = 0; threw = false
  :: kind != K_USE && threw -> /* the exchange throws: no change, and for
       a guard's constructor, no scope (the caller sees threw) */
     queryBlocks = true; assert(!queryBlocks);
     out = 0; if :: kind != K_GUARD -> threw = false :: else -> skip fi
  :: kind != K_USE && !threw ->
     /* set_stream(target): exchangeCurrentIndex(target), or CurrentStreamGuard
        g(pool, target): previous_ = exchangeCurrentIndex(target) */
     if :: kind == K_SET -> CHOOSE(tgt, ANY_OK) :: else -> CHOOSE(tgt, GUARD_OK) fi;
     exchange_set(tgt, out, false); tgt = 0;
     if
     :: kind == K_GUARD -> skip /* out is previous_ */
     :: kind == K_INNER -> out = 0; inner--
     :: kind == K_SET -> out = 0
     fi
  fi
}

/* the thread's binding goes (thread exit): thread 0's stack too */
inline drop_binding() {
  cur[me] = -1; cache[me] = -1; SET_RELEASED(-1); shared[me] = -1;
  prov[me] = false;
  if
  :: me == 0 -> do :: dn > 0 -> dn--; disp[dn] = 0 :: else -> break od
  :: else -> skip
  fi
}

/* ---- the child of fork(), evaluated within the fork() step ------------ */
/* Copies of the forking thread's binding (lease), of mu_ and of
   registry().mu: a lock another parent thread held at fork() stays held for
   good in the child. The pool's prepare handler takes registry().mu, so the
   child finds that one free; the model lets its copy be held too (more runs
   than the code has, none fewer). No handler takes mu_. */
inline fork_child(lease) {
  /* its one call: currentIndex()'s fast path misses (onForkChild cleared
     tls_slot_cache) and currentIndexSlow()'s checkNotForked() throws; every
     other API call starts with checkNotForked() and throws; or no call */
  if
  :: skip /* _exit(): no thread_local destructors (multiprocessing, tests) */
  :: CHILD_SKIPS(lease) -> skip
     /* exit() or the thread function returns: ~ThreadBindings runs and
        skips the binding; then tls_slot_cache = {0, -1} */
  :: !CHILD_SKIPS(lease) ->
     /* ~ThreadBindings takes the lease back: MutexLock lock(reg.mu);
        reg.pools.find() finds the parent's pool in the copied registry ->
        returnSlot(b.leased): release_hook_ -> onLeaseReleased(stream) ->
        stream.synchronize(COMMIT) on the parent's Metal stream */
#ifndef CHILD_HOOK_OK
     hookInChild = true;
     assert(!hookInChild);
#endif
     /* MutexLock lock(reg.mu), then returnSlot's lock(mu_): a lock copied
        held never comes free in the child */
     childBlocks = (regmu != 0 || mu != 0);
     assert(!childBlocks)
  fi
}

/* ---- a non-main thread ----------------------------------------------- */
proctype Worker(byte me; byte maxops) {
  byte ops;
  short idx, prev, tgt, ret;
  bool threw, timedOut;

  do
#ifndef CHURN
  :: ops < maxops && MAY_CALL -> ops++;
#else
  :: MAY_CALL ->
#endif
    if
    :: use_current_stream()
    :: release_current_thread_slot(MAY_RELEASE, true)
    :: exchange_previous(idx, MAY_EXCHANGE, K_SET) /* set_stream(target) */
    :: /* CurrentStreamGuard g(pool, target), then the scope's work: at most
         one set_stream(), then possibly a release, then possibly a
         currentStream(), then ~CurrentStreamGuard (DTOR). A scope with no
         work is offered only where none can be done: it adds nothing that
         a currentStream() does not. */
      exchange_previous(prev, MAY_EXCHANGE, K_GUARD);
      if
      :: atomic { threw -> threw = false } /* the constructor threw */
      :: exchange_previous(idx, !threw && inner > 0, K_INNER);
         if
         :: release_current_thread_slot(MAY_RELEASE, false);
            if
            :: current_index(idx, MAY_USE, K_USE); atomic { DTOR }
            :: atomic { DTOR }
            fi
         :: atomic { DTOR }
         fi
      :: release_current_thread_slot(!threw && MAY_RELEASE, false);
         if
         :: current_index(idx, MAY_USE, K_USE); atomic { DTOR }
         :: atomic { DTOR }
         fi
      :: atomic { !threw && inner == 0 && !(MAY_RELEASE) -> DTOR }
      fi
    fi
    /* each path above clears the locals it used in its last step, so
       that states do not differ in dead values */
#ifndef NOFORK
  :: atomic { me == 0 -> fork_child(leased[me]) }
    /* fork() between two calls; this thread carries on in the parent. The
       step changes no state of the parent, so it need not be counted or
       limited: a second fork() is a new child from the same parent state */
#endif
  :: atomic { me == 3 && leased[me] >= 0 && cache[me] == leased[me] -> skip }
    /* thread 3 may keep working on its leased stream (fast path of
       currentStream()) for as long as it likes, even forever: a cycle that
       only weak fairness keeps from starving the other threads */
  :: atomic { leased[me] < 0 -> drop_binding() };
    break
    /* the thread exits holding no lease: ~ThreadBindings skips every
       binding (b.leased < 0) and sets tls_slot_cache = {0, -1} */
  :: atomic { leased[me] >= 0 && regmu == 0 -> regmu = me + 1;
       /* the thread exits holding a lease: ~ThreadBindings: the binding's
          fork generation is current; MutexLock lock(reg.mu);
          reg.pools.find(b.pool_id) finds the (leaked, never destroyed)
          pool -> returnSlot(b.leased): release_hook_(index), push. The
          dying binding counts as gone here, and so does tls_slot_cache,
          which the destructor then sets to {0, -1}: only this thread sees
          them. */
       ret = leased[me]; leased[me] = -1; drop_binding();
       HOOK_CHECK(ret); PUSH(ret) };
    atomic { notify_one(); /* returnSlot's notifyOne() */
      assert(regmu == me + 1); regmu = 0; /* ~MutexLock */
      ret = 0 }
    break
  od
}

/* Invariants, checked in every reachable state */
active proctype monitor() {
end:
  atomic { !INV -> check_inv() }
}

init {
  atomic {
#ifndef POLICY
    /* StreamPoolOptions::fromEnvironment(): any policy, for good */
    if
    :: POLICY_FROM <= SHARE -> policy = SHARE
    :: POLICY_FROM <= THROW -> policy = THROW
    :: POLICY_FROM <= WAIT -> policy = WAIT
    :: true -> policy = WAITTO
    fi;
#endif
    run Worker(0, OPS0); run Worker(1, OPS1);
    run Worker(2, OPS2); run Worker(3, OPS2)
  }
}

/* Liveness: every thread that blocks in acquireWorkerSlot is eventually served
   or times out. Checked with weak fairness (pan -a -f) and SPURIOUS=0:
   fairness would otherwise force the spurious wakeup, which could mask a
   lost notification. Without -f it fails: thread 3 using its stream
   forever starves a runnable thread. */
#define LIVE(t) [] (waiting[t] -> <> !waiting[t])
ltl live { LIVE(0) && LIVE(1) && LIVE(2) && LIVE(3) }

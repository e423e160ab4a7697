//! Typed `u32` ids and the arena they index (cranelift-entity style, written small).

use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// An id type: a `u32` newtype.
pub trait EntityId: Copy + Eq + Ord + std::hash::Hash {
    /// The id of the `index`-th element.
    fn new(index: usize) -> Self;
    /// The index this id names.
    fn index(self) -> usize;
}

/// Declares a `u32` newtype id with a display prefix.
macro_rules! entity_id {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(transparent)]
        pub struct $name(u32);

        impl $crate::ir::entity::EntityId for $name {
            fn new(index: usize) -> Self {
                // Arenas hold at most u32::MAX entries; `Arena::push` checks this.
                $name(index as u32)
            }
            fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl $name {
            /// The raw index.
            pub fn as_u32(self) -> u32 {
                self.0
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}
pub(crate) use entity_id;

/// A dense map from ids to values; ids are handed out in push order.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Arena<I, T> {
    items: Vec<T>,
    _id: PhantomData<fn(I) -> I>,
}

impl<I: EntityId, T> Default for Arena<I, T> {
    fn default() -> Self {
        Arena {
            items: Vec::new(),
            _id: PhantomData,
        }
    }
}

impl<I: EntityId, T: std::fmt::Debug> std::fmt::Debug for Arena<I, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.items.iter()).finish()
    }
}

impl<I: EntityId, T> Arena<I, T> {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a value and returns its id.
    ///
    /// # Panics
    /// If the arena already holds `u32::MAX` entries (an internal limit, not reachable from a
    /// parsed file of a sane size).
    #[allow(clippy::panic, reason = "documented capacity limit of the IR")]
    pub fn push(&mut self, value: T) -> I {
        if self.items.len() >= u32::MAX as usize {
            panic!("arena capacity exceeded");
        }
        let id = I::new(self.items.len());
        self.items.push(value);
        id
    }

    /// Removes and returns the last value (the parser drops a var it made for a binding that
    /// turns out to be an `if` branch's result).
    pub fn pop(&mut self) -> Option<T> {
        self.items.pop()
    }

    /// Reserves room for at least `additional` more entries.
    pub fn reserve(&mut self, additional: usize) {
        self.items.reserve(additional);
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the arena is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The value for `id`, if `id` is in range.
    pub fn get(&self, id: I) -> Option<&T> {
        self.items.get(id.index())
    }

    /// Iterates `(id, value)` in id order.
    pub fn iter(&self) -> impl Iterator<Item = (I, &T)> {
        self.items.iter().enumerate().map(|(i, v)| (I::new(i), v))
    }

    /// Iterates `(id, value)` in id order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (I, &mut T)> {
        self.items
            .iter_mut()
            .enumerate()
            .map(|(i, v)| (I::new(i), v))
    }

    /// Iterates the ids in order.
    pub fn keys(&self) -> impl Iterator<Item = I> + use<I, T> {
        (0..self.items.len()).map(I::new)
    }
}

impl<I: EntityId, T> Index<I> for Arena<I, T> {
    type Output = T;
    fn index(&self, id: I) -> &T {
        &self.items[id.index()]
    }
}

impl<I: EntityId, T> IndexMut<I> for Arena<I, T> {
    fn index_mut(&mut self, id: I) -> &mut T {
        &mut self.items[id.index()]
    }
}

// Declaration-only stand-in for <MetalPerformanceShaders/MetalPerformanceShaders.h>,
// written from Apple's public documentation
// (developer.apple.com/documentation/metalperformanceshaders) for a syntax
// check on Linux; not Apple's header. It declares only what PyTorch's MPS
// sources and the stream-pool patch use, with Apple's names and types;
// nullability and availability annotations are left out.
#pragma once
#include <Metal/Metal.h>
// MPS declares simd vector fields (MPSImageHistogramInfo.minPixelValue is a
// vector_float4), so including it brings <simd/simd.h> in.
#include <simd/simd.h>

// --- Core types -------------------------------------------------------------

typedef NS_OPTIONS(uint32_t, MPSDataType) {
  MPSDataTypeInvalid = 0,
  MPSDataTypeFloatBit = 0x10000000,
  MPSDataTypeFloat32 = MPSDataTypeFloatBit | 32,
  MPSDataTypeFloat16 = MPSDataTypeFloatBit | 16,
  MPSDataTypeComplexBit = 0x01000000,
  MPSDataTypeComplexFloat32 = MPSDataTypeFloatBit | MPSDataTypeComplexBit | 64,
  MPSDataTypeComplexFloat16 = MPSDataTypeFloatBit | MPSDataTypeComplexBit | 32,
  MPSDataTypeSignedBit = 0x20000000,
  MPSDataTypeIntBit = MPSDataTypeSignedBit,
  MPSDataTypeInt8 = MPSDataTypeSignedBit | 8,
  MPSDataTypeInt16 = MPSDataTypeSignedBit | 16,
  MPSDataTypeInt32 = MPSDataTypeSignedBit | 32,
  MPSDataTypeInt64 = MPSDataTypeSignedBit | 64,
  MPSDataTypeUInt8 = 8,
  MPSDataTypeUInt16 = 16,
  MPSDataTypeUInt32 = 32,
  MPSDataTypeUInt64 = 64,
  MPSDataTypeAlternateEncodingBit = 0x80000000,
  MPSDataTypeBool = MPSDataTypeAlternateEncodingBit | 8,
  MPSDataTypeBFloat16 = MPSDataTypeAlternateEncodingBit | MPSDataTypeFloat16,
  MPSDataTypeNormalizedBit = 0x40000000,
  MPSDataTypeUnorm1 = MPSDataTypeNormalizedBit | 1,
  MPSDataTypeUnorm8 = MPSDataTypeNormalizedBit | 8,
};

typedef NSArray<NSNumber*> MPSShape;

typedef NS_OPTIONS(NSUInteger, MPSAliasingStrategy) {
  MPSAliasingStrategyDefault = 0,
  MPSAliasingStrategyDontCare = MPSAliasingStrategyDefault,
  MPSAliasingStrategyShallAlias = 1UL << 0,
  MPSAliasingStrategyWillAlias = MPSAliasingStrategyShallAlias,
  MPSAliasingStrategyShallNotAlias = 1UL << 1,
  MPSAliasingStrategyWontAlias = MPSAliasingStrategyShallNotAlias,
  MPSAliasingStrategyPreferTemporaryMemory = 1UL << 2,
  MPSAliasingStrategyPreferNonTemporaryMemory = 1UL << 3,
};

// --- Kernels and command buffers --------------------------------------------

@interface MPSKernel : NSObject<NSCopying>
- (instancetype)initWithDevice:(id<MTLDevice>)device;
@property(readonly, retain, nonatomic) id<MTLDevice> device;
@end

@interface MPSCommandBuffer : NSObject<MTLCommandBuffer>
+ (instancetype)commandBufferFromCommandQueue:(id<MTLCommandQueue>)commandQueue;
@property(readonly, retain) id<MTLCommandBuffer> commandBuffer;
- (void)commitAndContinue;
@end

// --- Matrices ---------------------------------------------------------------

@interface MPSMatrixDescriptor : NSObject
+ (MPSMatrixDescriptor*)matrixDescriptorWithRows:(NSUInteger)rows
                                         columns:(NSUInteger)columns
                                        rowBytes:(NSUInteger)rowBytes
                                        dataType:(MPSDataType)dataType;
+ (MPSMatrixDescriptor*)matrixDescriptorWithRows:(NSUInteger)rows
                                         columns:(NSUInteger)columns
                                        matrices:(NSUInteger)matrices
                                        rowBytes:(NSUInteger)rowBytes
                                     matrixBytes:(NSUInteger)matrixBytes
                                        dataType:(MPSDataType)dataType;
@end

@interface MPSMatrix : NSObject
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer descriptor:(MPSMatrixDescriptor*)descriptor;
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer
                        offset:(NSUInteger)offset
                    descriptor:(MPSMatrixDescriptor*)descriptor;
@end

@interface MPSMatrixUnaryKernel : MPSKernel
@end

@interface MPSMatrixBinaryKernel : MPSKernel
@end

@interface MPSMatrixDecompositionLU : MPSMatrixUnaryKernel
- (instancetype)initWithDevice:(id<MTLDevice>)device rows:(NSUInteger)rows columns:(NSUInteger)columns;
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)commandBuffer
                 sourceMatrix:(MPSMatrix*)sourceMatrix
                 resultMatrix:(MPSMatrix*)resultMatrix
                 pivotIndices:(MPSMatrix*)pivotIndices
                       status:(id<MTLBuffer>)status;
@end

@interface MPSMatrixSolveLU : MPSMatrixBinaryKernel
- (instancetype)initWithDevice:(id<MTLDevice>)device
                     transpose:(BOOL)transpose
                         order:(NSUInteger)order
        numberOfRightHandSides:(NSUInteger)numberOfRightHandSides;
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)commandBuffer
                 sourceMatrix:(MPSMatrix*)sourceMatrix
          rightHandSideMatrix:(MPSMatrix*)rightHandSideMatrix
                 pivotIndices:(MPSMatrix*)pivotIndices
               solutionMatrix:(MPSMatrix*)solutionMatrix;
@end

@interface MPSMatrixSolveTriangular : MPSMatrixBinaryKernel
- (instancetype)initWithDevice:(id<MTLDevice>)device
                         right:(BOOL)right
                         upper:(BOOL)upper
                     transpose:(BOOL)transpose
                          unit:(BOOL)unit
                         order:(NSUInteger)order
        numberOfRightHandSides:(NSUInteger)numberOfRightHandSides
                         alpha:(double)alpha;
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)commandBuffer
                 sourceMatrix:(MPSMatrix*)sourceMatrix
          rightHandSideMatrix:(MPSMatrix*)rightHandSideMatrix
               solutionMatrix:(MPSMatrix*)solutionMatrix;
@end

// --- N-dimensional arrays ---------------------------------------------------

@interface MPSNDArrayDescriptor : NSObject
@property(readwrite, nonatomic) MPSDataType dataType;
@property(readwrite, nonatomic) NSUInteger numberOfDimensions;
@property(readwrite, nonatomic) BOOL preferPackedRows;
+ (instancetype)descriptorWithDataType:(MPSDataType)dataType shape:(MPSShape*)shape;
- (void)transposeDimension:(NSUInteger)dimensionIndex withDimension:(NSUInteger)dimensionIndex2;
@end

@interface MPSNDArray : NSObject
- (instancetype)initWithDevice:(id<MTLDevice>)device descriptor:(MPSNDArrayDescriptor*)descriptor;
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer
                        offset:(NSUInteger)offset
                    descriptor:(MPSNDArrayDescriptor*)descriptor;
@property(readonly, nonatomic) MPSDataType dataType;
@property(readonly, nonatomic) NSUInteger numberOfDimensions;
@property(readonly, retain, nonatomic) id<MTLDevice> device;
- (MPSNDArrayDescriptor*)descriptor;
- (void)writeBytes:(void*)buffer strideBytes:(NSInteger*)strideByteSizes;
- (MPSNDArray*)arrayViewWithCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                               descriptor:(MPSNDArrayDescriptor*)descriptor
                                 aliasing:(MPSAliasingStrategy)aliasing;
- (MPSNDArray*)arrayViewWithShape:(MPSShape*)shape strides:(MPSShape*)strides;
@end

@interface MPSNDArrayMultiaryBase : MPSKernel
@end

@interface MPSNDArrayMultiaryKernel : MPSNDArrayMultiaryBase
- (instancetype)initWithDevice:(id<MTLDevice>)device sourceCount:(NSUInteger)count;
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                 sourceArrays:(NSArray<MPSNDArray*>*)sourceArrays
             destinationArray:(MPSNDArray*)destination;
- (MPSNDArray*)encodeToCommandBuffer:(id<MTLCommandBuffer>)cmdBuf sourceArrays:(NSArray<MPSNDArray*>*)sourceArrays;
- (void)encodeToCommandEncoder:(id<MTLComputeCommandEncoder>)encoder
                 commandBuffer:(id<MTLCommandBuffer>)commandBuffer
                  sourceArrays:(NSArray<MPSNDArray*>*)sourceArrays
              destinationArray:(MPSNDArray*)destination;
@end

@interface MPSNDArrayUnaryKernel : MPSNDArrayMultiaryKernel
- (instancetype)initWithDevice:(id<MTLDevice>)device;
- (void)encodeToCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                  sourceArray:(MPSNDArray*)sourceArray
             destinationArray:(MPSNDArray*)destination;
@end

@interface MPSNDArrayMatrixMultiplication : MPSNDArrayMultiaryKernel
@property(readwrite, nonatomic) double alpha;
@property(readwrite, nonatomic) double beta;
@end

@interface MPSNDArrayIdentity : MPSNDArrayUnaryKernel
- (MPSNDArray*)reshapeWithCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                            sourceArray:(MPSNDArray*)sourceArray
                                  shape:(MPSShape*)shape
                       destinationArray:(MPSNDArray*)destinationArray;
@end
